-- Schema version 13 (0013_sessions.sql), the nodes module's part: it names only
-- the nodes module's tables. store.Migrate applies every module's part of a
-- version in one transaction, in the module order of internal/store/modules.go.

-- Schema version 13: sessions known across gateway processes, flips
-- counted per node, renewals chained and rate limited.
-- node_sessions.heartbeat_at is refreshed by the session's gateway; a
-- session without a heartbeat within its window went quiet and is
-- superseded without counting a flip. node_certs.renewed_from names the
-- certificate a renewal was asked with (NULL for a join's certificate).

ALTER TABLE node_sessions ADD COLUMN heartbeat_at BIGINT;

CREATE INDEX node_sessions_connected ON node_sessions(connected_at);

CREATE INDEX node_sessions_gateway ON node_sessions(gateway_id, closed_at);

CREATE INDEX session_flips_node ON session_flips(node_id, at);

ALTER TABLE node_certs ADD COLUMN renewed_from TEXT;
