-- Schema version 5 (0005_secrets.sql), the secrets module's part: it names only
-- the secrets module's tables. store.Migrate applies every module's part of a
-- version in one transaction, in the module order of internal/store/modules.go.

-- Schema version 5: sealed secrets and the broker's seen request ids.
-- Values are never stored in the clear: sealed holds AES-256-GCM under the
-- key-encryption key, bound to (ref, tenant, version).

CREATE TABLE secrets (
  ref         TEXT NOT NULL,
  version     INTEGER NOT NULL,
  tenant_id   TEXT NOT NULL REFERENCES tenants(id),
  name        TEXT NOT NULL,
  scope       TEXT NOT NULL,
  sealed      BLOB NOT NULL,
  created_by  TEXT NOT NULL,
  created_at  BIGINT NOT NULL,
  deleted_at  BIGINT,
  PRIMARY KEY (ref, version)
);

CREATE INDEX secrets_tenant ON secrets(tenant_id, name);

CREATE TABLE secret_requests (
  request_id  TEXT PRIMARY KEY,
  node_id     TEXT NOT NULL,
  at          BIGINT NOT NULL
);
