-- Schema version 25 (0025_tenancy_fixes.sql), the apikeys module's part: it names only
-- the apikeys module's tables. store.Migrate applies every module's part of a
-- version in one transaction, in the module order of internal/store/modules.go.

ALTER TABLE api_keys ADD COLUMN made_by TEXT;

CREATE INDEX api_keys_made_by ON api_keys(made_by);
