-- Schema version 34 (0034_revocations.sql), the revocations module's part: it
-- names only the revocations module's tables. store.Migrate applies every
-- module's part of a version in one transaction, in the module order of
-- internal/store/modules.go.

-- revocation_seq: the feed's one counter row. Every revocation takes the
-- next numbers from it in its own transaction (UPDATE ... RETURNING), so
-- the row's lock orders concurrent revokers: the second waits for the
-- first to commit and numbers after it. Numbers are gapless (a rolled-back
-- revocation rolls its numbers back) and in commit order.
CREATE TABLE revocation_seq (
  id  INTEGER PRIMARY KEY,
  seq BIGINT NOT NULL
);
INSERT INTO revocation_seq (id, seq) VALUES (1, 0);

-- revocations: the feed, one row per revoked thing, by seq. body,
-- signature and signer_cert are NULL until a worker signs the entry
-- (revwire.SigContext over the body naming the deployment and seq).
CREATE TABLE revocations (
  seq         BIGINT PRIMARY KEY,
  kind        TEXT NOT NULL,
  subject     TEXT NOT NULL,
  tenant_id   TEXT NOT NULL,
  node_id     TEXT NOT NULL DEFAULT '',
  at          BIGINT NOT NULL,
  reason      TEXT NOT NULL,
  generation  BIGINT NOT NULL DEFAULT 0,
  body        BLOB,
  signature   BLOB,
  signer_cert BLOB
);
CREATE INDEX revocations_node ON revocations (node_id, at);
CREATE INDEX revocations_tenant ON revocations (tenant_id, seq);
CREATE INDEX revocations_unsigned ON revocations (seq) WHERE signature IS NULL;
