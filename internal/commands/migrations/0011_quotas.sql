-- Schema version 11 (0011_quotas.sql), the commands module's part: it names only
-- the commands module's tables. store.Migrate applies every module's part of a
-- version in one transaction, in the module order of internal/store/modules.go.

CREATE INDEX commands_tenant_state ON commands(tenant_id, state);
