-- Schema version 1 (0001_init.sql), the iam module's part: it names only
-- the iam module's tables. store.Migrate applies every module's part of a
-- version in one transaction, in the module order of internal/store/modules.go.

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
