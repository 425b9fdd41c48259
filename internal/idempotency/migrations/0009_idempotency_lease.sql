-- Schema version 9 (0009_idempotency_lease.sql), the idempotency module's part: it names only
-- the idempotency module's tables. store.Migrate applies every module's part of a
-- version in one transaction, in the module order of internal/store/modules.go.

-- Schema version 9: idempotency rows expire and in-progress rows hold a
-- lease. lease_expires_at (unix ms) is when a row still in progress
-- (status 0) may be taken over by a retry: the request that holds it
-- renews it while it runs, so a row whose process died is released after
-- the lease. Rows older than 24 h are swept and treated as new. Answers
-- that carried a credential are never kept: existing ones are cleared.

ALTER TABLE idempotency ADD COLUMN lease_expires_at BIGINT NOT NULL DEFAULT 0;

CREATE INDEX idempotency_created ON idempotency(created_at);

UPDATE idempotency SET response = NULL WHERE method IN ('apiKeys.create', 'joinTokens.create', 'joinTokens.createMany', 'sessions.create');
