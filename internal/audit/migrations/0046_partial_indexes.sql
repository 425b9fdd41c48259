-- Schema version 46 (0046_partial_indexes.sql), the audit module's part: it
-- names only the audit module's tables. store.Migrate applies every module's
-- parts of a version in one transaction.

-- seq is NULL when an audit row is written and numbered later by the
-- sealer: the unique index on (tenant_id, seq) holds the numbered rows
-- only (two numbered rows of a tenant still cannot share a number; every
-- statement that reads it by seq compares seq, which implies NOT NULL),
-- so writing a row no longer writes this index too.
DROP INDEX audit_events_tenant_seq;
CREATE UNIQUE INDEX audit_events_tenant_seq ON audit_events(tenant_id, seq) WHERE seq IS NOT NULL;
