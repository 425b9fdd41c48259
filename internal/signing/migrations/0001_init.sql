-- Schema version 1 (0001_init.sql), the signing module's part: it names only
-- the signing module's tables. store.Migrate applies every module's part of a
-- version in one transaction, in the module order of internal/store/modules.go.

CREATE TABLE worker_keys (
  id          TEXT PRIMARY KEY,
  cert_der    BLOB NOT NULL,
  sealed_key  BLOB NOT NULL,
  not_after   BIGINT NOT NULL,
  created_at  BIGINT NOT NULL
);
