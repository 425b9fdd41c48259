-- Schema version 12 (0012_time_statements.sql), the signing module's part: it names only
-- the signing module's tables. store.Migrate applies every module's part of a
-- version in one transaction, in the module order of internal/store/modules.go.

-- The latest time statement a worker signed (one row, id 'latest'). The
-- gateway relays it in every Welcome; nodes take it as a lower bound on
-- the time. Only a newer statement replaces it.
CREATE TABLE time_statements (
  id          TEXT PRIMARY KEY,
  body        BLOB NOT NULL,
  signature   BLOB NOT NULL,
  signer_cert BLOB NOT NULL,
  time_ms     BIGINT NOT NULL
);
