-- Schema version 4 (0004_quorum.sql), the quorum module's part: it names only
-- the quorum module's tables. store.Migrate applies every module's part of a
-- version in one transaction, in the module order of internal/store/modules.go.

-- Schema version 4: the destructive-batch quorum (package quorum).
-- A batch is a list of leaves (node, kind, payload digest or unbound) under
-- an RFC 6962 Merkle root; approvers held off the control plane sign
-- (deployment, batch id, root, expiry). Approver-set changes are signed by
-- the set before them. Times are unix milliseconds. BLOB becomes BYTEA on
-- PostgreSQL.

CREATE TABLE batches (
  id            TEXT PRIMARY KEY,
  tenant_id     TEXT NOT NULL,
  deployment    TEXT NOT NULL,
  root          BLOB NOT NULL,
  leaf_count    INTEGER NOT NULL,
  state         TEXT NOT NULL,
  proposed_by   TEXT NOT NULL,
  agent         TEXT NOT NULL DEFAULT '',
  agent_for     TEXT NOT NULL DEFAULT '',
  created_at    BIGINT NOT NULL,
  expires_at    BIGINT NOT NULL,
  approved_at   BIGINT
);

CREATE INDEX batches_state ON batches(state);

CREATE TABLE batch_leaves (
  batch_id       TEXT NOT NULL REFERENCES batches(id),
  idx            INTEGER NOT NULL,
  node_id        TEXT NOT NULL,
  kind           TEXT NOT NULL,
  unbound        INTEGER NOT NULL,
  payload_sha256 BLOB NOT NULL,
  payload        BLOB,
  PRIMARY KEY (batch_id, idx)
);

CREATE TABLE batch_approvals (
  batch_id     TEXT NOT NULL REFERENCES batches(id),
  approver_key BLOB NOT NULL,
  signature    BLOB NOT NULL,
  submitted_by TEXT NOT NULL,
  created_at   BIGINT NOT NULL,
  PRIMARY KEY (batch_id, approver_key)
);

CREATE TABLE approver_sets (
  generation  BIGINT PRIMARY KEY,
  deployment  TEXT NOT NULL,
  threshold   INTEGER NOT NULL,
  keys        BLOB NOT NULL,
  signatures  TEXT NOT NULL,
  created_at  BIGINT NOT NULL
);

CREATE TABLE approver_set_signatures (
  generation   BIGINT NOT NULL,
  message      BLOB NOT NULL,
  approver_key BLOB NOT NULL,
  signature    BLOB NOT NULL,
  threshold    INTEGER NOT NULL,
  keys         BLOB NOT NULL,
  submitted_by TEXT NOT NULL,
  created_at   BIGINT NOT NULL,
  PRIMARY KEY (generation, message, approver_key)
);
