-- Schema version 4 (0004_quorum.sql), the commands module's part: it names only
-- the commands module's tables. store.Migrate applies every module's part of a
-- version in one transaction, in the module order of internal/store/modules.go.

ALTER TABLE commands ADD COLUMN batch_id TEXT;
