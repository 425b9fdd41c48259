-- Schema version 1 (0001_init.sql), the commands module's part: it names only
-- the commands module's tables. store.Migrate applies every module's part of a
-- version in one transaction, in the module order of internal/store/modules.go.

CREATE TABLE commands (
  id                 TEXT PRIMARY KEY,
  tenant_id          TEXT NOT NULL REFERENCES tenants(id),
  node_id            TEXT NOT NULL,
  kind               TEXT NOT NULL,
  payload            BLOB NOT NULL,
  state              TEXT NOT NULL,
  reason             TEXT NOT NULL DEFAULT '',
  result             BLOB,
  attested           INTEGER NOT NULL DEFAULT 0,
  created_by         TEXT NOT NULL,
  created_at         BIGINT NOT NULL,
  updated_at         BIGINT NOT NULL,
  expires_at         BIGINT NOT NULL,
  body               BLOB,
  signature          BLOB,
  signer_cert        BLOB,
  update_body        BLOB,
  node_sig           BLOB,
  update_cert_serial TEXT
);

CREATE INDEX commands_node_state ON commands(node_id, state);

CREATE INDEX commands_state ON commands(state);
