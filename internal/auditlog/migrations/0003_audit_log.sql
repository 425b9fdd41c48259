-- Schema version 3 (0003_audit_log.sql), the auditlog module's part: it names only
-- the auditlog module's tables. store.Migrate applies every module's part of a
-- version in one transaction, in the module order of internal/store/modules.go.

-- One row per tenant's log: its size and compact range (the hashes of the
-- perfect subtrees covering [0, size), concatenated). Sealers lock it.
CREATE TABLE audit_log_state (
  tenant_id   TEXT PRIMARY KEY,
  size        BIGINT NOT NULL,
  compact     BLOB NOT NULL,
  updated_at  BIGINT NOT NULL
);

-- Every perfect-subtree hash of every log (level 0 = leaf hashes, with the
-- event id), so that a proof is one indexed read.
CREATE TABLE audit_log_nodes (
  tenant_id  TEXT NOT NULL,
  level      INTEGER NOT NULL,
  idx        BIGINT NOT NULL,
  hash       BLOB NOT NULL,
  event_id   TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (tenant_id, level, idx)
);

-- Signed checkpoints (C2SP tlog-checkpoint as a signed note) with the
-- consistency proof from the previous one (prev_size).
CREATE TABLE audit_checkpoints (
  tenant_id    TEXT NOT NULL,
  size         BIGINT NOT NULL,
  prev_size    BIGINT NOT NULL,
  note         BLOB NOT NULL,
  consistency  BLOB NOT NULL,
  created_at   BIGINT NOT NULL,
  PRIMARY KEY (tenant_id, size)
);

-- Where each audit sink is in each tenant's log: the next seq to copy.
CREATE TABLE audit_sink_cursors (
  sink        TEXT NOT NULL,
  tenant_id   TEXT NOT NULL,
  next_seq    BIGINT NOT NULL,
  updated_at  BIGINT NOT NULL,
  PRIMARY KEY (sink, tenant_id)
);
