-- Schema version 2 (0002_iam.sql), the idempotency module's part: it names only
-- the idempotency module's tables. store.Migrate applies every module's part of a
-- version in one transaction, in the module order of internal/store/modules.go.

CREATE TABLE idempotency (
  tenant_id    TEXT NOT NULL,
  identity_id  TEXT NOT NULL,
  key          TEXT NOT NULL,
  method       TEXT NOT NULL,
  body_sha256  BLOB NOT NULL,
  status       INTEGER NOT NULL,
  response     BLOB,
  created_at   BIGINT NOT NULL,
  PRIMARY KEY (tenant_id, identity_id, key)
);
