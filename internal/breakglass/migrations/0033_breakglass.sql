-- Schema version 33 (0033_breakglass.sql), the breakglass module's part: it names only
-- the breakglass module's tables. store.Migrate applies every module's part of a
-- version in one transaction, in the module order of internal/store/modules.go.

-- ssh_certs: every break-glass SSH certificate issued, by serial (unique,
-- never 0, below 2^63): its tenant, node, account, the identity that asked,
-- the SHA-256 fingerprint of the public key it certifies, and when it was
-- issued, valid from, expires and was revoked. No certificate bytes.
CREATE TABLE ssh_certs (
  serial          BIGINT PRIMARY KEY,
  tenant_id       TEXT NOT NULL REFERENCES tenants(id),
  node_id         TEXT NOT NULL,
  account         TEXT NOT NULL,
  identity_id     TEXT NOT NULL,
  key_fingerprint TEXT NOT NULL,
  issued_at       BIGINT NOT NULL,
  valid_after     BIGINT NOT NULL,
  expires_at      BIGINT NOT NULL,
  revoked_at      BIGINT,
  revoked_by      TEXT
);
CREATE INDEX ssh_certs_node ON ssh_certs (node_id, expires_at);

-- ssh_access_gen: the last generation of each node's break-glass state;
-- its row is the lock two concurrent changes of one node take in turn.
CREATE TABLE ssh_access_gen (
  node_id    TEXT PRIMARY KEY,
  generation BIGINT NOT NULL
);

-- ssh_access: each state (sshca.Access) queued to a node as an ssh.access
-- command, by generation, with the command's id once it is queued.
CREATE TABLE ssh_access (
  node_id    TEXT NOT NULL,
  generation BIGINT NOT NULL,
  tenant_id  TEXT NOT NULL REFERENCES tenants(id),
  command_id TEXT NOT NULL DEFAULT '',
  payload    TEXT NOT NULL,
  created_at BIGINT NOT NULL,
  PRIMARY KEY (node_id, generation)
);
