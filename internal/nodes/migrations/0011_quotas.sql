-- Schema version 11 (0011_quotas.sql), the nodes module's part: it names only
-- the nodes module's tables. store.Migrate applies every module's part of a
-- version in one transaction, in the module order of internal/store/modules.go.

CREATE INDEX join_tokens_outstanding ON join_tokens(tenant_id, expires_at) WHERE used_at IS NULL;
