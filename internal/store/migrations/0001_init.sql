-- Schema version 1: tenants, keys, nodes and their certificates, sessions,
-- commands, worker keys, audit rows and security events.
-- Times are unix milliseconds. BLOB becomes BYTEA on PostgreSQL.

CREATE TABLE tenants (
  id          TEXT PRIMARY KEY,
  parent_id   TEXT,
  name        TEXT NOT NULL,
  state       TEXT NOT NULL,
  created_at  BIGINT NOT NULL
);
INSERT INTO tenants (id, parent_id, name, state, created_at) VALUES ('root', NULL, 'root', 'active', 0);

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

CREATE TABLE worker_keys (
  id          TEXT PRIMARY KEY,
  cert_der    BLOB NOT NULL,
  sealed_key  BLOB NOT NULL,
  not_after   BIGINT NOT NULL,
  created_at  BIGINT NOT NULL
);

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

CREATE TABLE audit_events (
  id          TEXT PRIMARY KEY,
  tenant_id   TEXT NOT NULL,
  at          BIGINT NOT NULL,
  actor       TEXT NOT NULL,
  action      TEXT NOT NULL,
  resource    TEXT NOT NULL,
  outcome     TEXT NOT NULL,
  request_id  TEXT NOT NULL DEFAULT '',
  caller      TEXT NOT NULL DEFAULT '',
  details     TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX audit_events_tenant ON audit_events(tenant_id, at);

CREATE TABLE events (
  id       TEXT PRIMARY KEY,
  at       BIGINT NOT NULL,
  type     TEXT NOT NULL,
  node_id  TEXT NOT NULL DEFAULT '',
  details  TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX events_type ON events(type, at);
