-- Schema version 1 (0001_init.sql), the apikeys module's part: it names only
-- the apikeys module's tables. store.Migrate applies every module's part of a
-- version in one transaction, in the module order of internal/store/modules.go.

CREATE TABLE api_keys (
  id          TEXT PRIMARY KEY,
  tenant_id   TEXT NOT NULL REFERENCES tenants(id),
  identity    TEXT NOT NULL,
  name        TEXT NOT NULL,
  hash        BLOB NOT NULL UNIQUE,
  scopes      TEXT NOT NULL DEFAULT '',
  created_at  BIGINT NOT NULL,
  expires_at  BIGINT,
  revoked_at  BIGINT
);
