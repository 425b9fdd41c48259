-- Schema version 11: per-tenant quotas. tenant_quotas holds a root
-- operator's overrides (NULL: the configured default); the indexes let a
-- quota count what one tenant holds without scanning every tenant's rows.

CREATE TABLE tenant_quotas (
  tenant_id          TEXT PRIMARY KEY REFERENCES tenants(id),
  join_tokens        BIGINT,
  sandboxes          BIGINT,
  warm_memory_mb     BIGINT,
  commands_in_flight BIGINT,
  updated_at         BIGINT NOT NULL
);

CREATE INDEX join_tokens_outstanding ON join_tokens(tenant_id, expires_at) WHERE used_at IS NULL;
CREATE INDEX commands_tenant_state ON commands(tenant_id, state);
