-- Schema version 11 (0011_quotas.sql), the quota module's part: it names only
-- the quota module's tables. store.Migrate applies every module's part of a
-- version in one transaction, in the module order of internal/store/modules.go.

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

-- quota_usage keeps what a tenant holds of a large quota (join tokens,
-- commands in flight), raised in the transaction of each admitted insert,
-- so admitting is not a count over the tenant's rows. Rows freed without a
-- decrement (tokens used or expired, commands finished) leave it high;
-- it is recounted exactly when it would refuse (at most once a second per
-- process) and at least once a minute.
CREATE TABLE quota_usage (
  tenant_id   TEXT NOT NULL,
  kind        TEXT NOT NULL,
  used        BIGINT NOT NULL,
  counted_at  BIGINT NOT NULL,
  PRIMARY KEY (tenant_id, kind)
);
