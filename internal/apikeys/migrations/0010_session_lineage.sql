-- Schema version 10 (0010_session_lineage.sql), the apikeys module's part: it names only
-- the apikeys module's tables. store.Migrate applies every module's part of a
-- version in one transaction, in the module order of internal/store/modules.go.

-- Schema version 10: a session records the credential that made it. key_id
-- is the API key at the root of its lineage (a session made by a session
-- keeps its maker's key); parent_id is the session that made it, if one
-- did. A session is valid only while its key and every session above it
-- are, so a session without a key (made before this version) is invalid.

ALTER TABLE sessions ADD COLUMN key_id TEXT;

ALTER TABLE sessions ADD COLUMN parent_id TEXT;

CREATE INDEX sessions_key ON sessions(key_id);

CREATE INDEX sessions_parent ON sessions(parent_id);
