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
