-- Schema version 2 (0002_iam.sql), the apikeys module's part: it names only
-- the apikeys module's tables. store.Migrate applies every module's part of a
-- version in one transaction, in the module order of internal/store/modules.go.

CREATE TABLE sessions (
  id           TEXT PRIMARY KEY,
  hash         BLOB NOT NULL UNIQUE,
  tenant_id    TEXT NOT NULL,
  identity_id  TEXT NOT NULL,
  created_at   BIGINT NOT NULL,
  expires_at   BIGINT NOT NULL,
  revoked_at   BIGINT
);
