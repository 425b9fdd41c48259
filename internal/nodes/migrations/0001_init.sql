-- Schema version 1 (0001_init.sql), the nodes module's part: it names only
-- the nodes module's tables. store.Migrate applies every module's part of a
-- version in one transaction, in the module order of internal/store/modules.go.

CREATE TABLE join_tokens (
  id          TEXT PRIMARY KEY,
  tenant_id   TEXT NOT NULL REFERENCES tenants(id),
  hash        BLOB NOT NULL UNIQUE,
  role        TEXT NOT NULL,
  name        TEXT NOT NULL DEFAULT '',
  created_by  TEXT NOT NULL,
  created_at  BIGINT NOT NULL,
  expires_at  BIGINT NOT NULL,
  used_at     BIGINT,
  node_id     TEXT
);

CREATE TABLE nodes (
  id           TEXT PRIMARY KEY,
  tenant_id    TEXT NOT NULL REFERENCES tenants(id),
  name         TEXT NOT NULL,
  role         TEXT NOT NULL,
  created_at   BIGINT NOT NULL,
  labels       TEXT NOT NULL DEFAULT '{}',
  inventory    TEXT NOT NULL DEFAULT '{}',
  version      TEXT NOT NULL DEFAULT '',
  boot_id      TEXT NOT NULL DEFAULT '',
  last_seen_at BIGINT
);

CREATE TABLE node_certs (
  serial        TEXT PRIMARY KEY,
  node_id       TEXT NOT NULL REFERENCES nodes(id),
  role          TEXT NOT NULL,
  cert_der      BLOB NOT NULL,
  not_before    BIGINT NOT NULL,
  not_after     BIGINT NOT NULL,
  allowed_kinds TEXT,
  created_at    BIGINT NOT NULL,
  revoked_at    BIGINT,
  revoke_reason TEXT
);

CREATE INDEX node_certs_node ON node_certs(node_id);

CREATE INDEX node_certs_revoked ON node_certs(revoked_at);

CREATE TABLE node_sessions (
  node_id      TEXT PRIMARY KEY REFERENCES nodes(id),
  session_id   TEXT NOT NULL,
  gateway_id   TEXT NOT NULL,
  boot_id      TEXT NOT NULL,
  cert_serial  TEXT NOT NULL,
  connected_at BIGINT NOT NULL,
  closed_at    BIGINT
);

CREATE TABLE session_flips (
  id          TEXT PRIMARY KEY,
  cert_serial TEXT NOT NULL,
  node_id     TEXT NOT NULL,
  from_boot   TEXT NOT NULL,
  to_boot     TEXT NOT NULL,
  at          BIGINT NOT NULL
);

CREATE INDEX session_flips_serial ON session_flips(cert_serial, at);
