-- Schema version 25 (0025_tenancy_fixes.sql), the quota module's part: it names only
-- the quota module's tables. store.Migrate applies every module's part of a
-- version in one transaction, in the module order of internal/store/modules.go.

DELETE FROM quota_usage;
