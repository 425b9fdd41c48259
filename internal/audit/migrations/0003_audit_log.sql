-- Schema version 3 (0003_audit_log.sql), the audit module's part: it names only
-- the audit module's tables. store.Migrate applies every module's part of a
-- version in one transaction, in the module order of internal/store/modules.go.

-- Schema version 3: the tamper-evident audit log (internal/auditlog,
-- docs/audit.md). Times are unix milliseconds. BLOB becomes BYTEA on
-- PostgreSQL.

-- seq: the row's dense position in its tenant's log, given when sealed
-- (NULL until then).
ALTER TABLE audit_events ADD COLUMN seq BIGINT;

CREATE UNIQUE INDEX audit_events_tenant_seq ON audit_events(tenant_id, seq);

CREATE INDEX audit_events_unsealed ON audit_events(tenant_id, at, id) WHERE seq IS NULL;
