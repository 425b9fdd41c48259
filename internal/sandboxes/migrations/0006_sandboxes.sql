-- Schema version 6 (0006_sandboxes.sql), the sandboxes module's part: it names only
-- the sandboxes module's tables. store.Migrate applies every module's part of a
-- version in one transaction, in the module order of internal/store/modules.go.

-- Schema version 6: sandboxes. Images are content-addressed tars in the
-- object store (this table names them per tenant); uploads stage an
-- image's chunks; templates name an image, limits, lifetimes, a network
-- mode, environment and a warm pool size; sandboxes are placed on a host
-- and driven only by signed sandbox.* commands. Times are unix ms.

CREATE TABLE sandbox_images (
  id          TEXT PRIMARY KEY,
  tenant_id   TEXT NOT NULL REFERENCES tenants(id),
  name        TEXT NOT NULL,
  digest      TEXT NOT NULL,
  size_bytes  BIGINT NOT NULL,
  created_by  TEXT NOT NULL,
  created_at  BIGINT NOT NULL,
  UNIQUE (tenant_id, name)
);

CREATE TABLE sandbox_uploads (
  id          TEXT PRIMARY KEY,
  tenant_id   TEXT NOT NULL REFERENCES tenants(id),
  identity_id TEXT NOT NULL,
  next_offset BIGINT NOT NULL,
  created_at  BIGINT NOT NULL,
  done_at     BIGINT
);

CREATE TABLE sandbox_templates (
  id              TEXT PRIMARY KEY,
  tenant_id       TEXT NOT NULL REFERENCES tenants(id),
  name            TEXT NOT NULL,
  image_name      TEXT NOT NULL,
  image_digest    TEXT NOT NULL,
  runtime         TEXT NOT NULL,
  cpu_millis      BIGINT NOT NULL,
  memory_mb       BIGINT NOT NULL,
  pids            BIGINT NOT NULL,
  disk_mb         BIGINT NOT NULL,
  lifetime_ms     BIGINT NOT NULL,
  max_lifetime_ms BIGINT NOT NULL,
  network         TEXT NOT NULL,
  run_as_root     INTEGER NOT NULL DEFAULT 0,
  env             TEXT NOT NULL DEFAULT '{}',
  labels          TEXT NOT NULL DEFAULT '{}',
  warm            INTEGER NOT NULL DEFAULT 0,
  created_by      TEXT NOT NULL,
  created_at      BIGINT NOT NULL,
  UNIQUE (tenant_id, name)
);

CREATE TABLE sandboxes (
  id           TEXT PRIMARY KEY,
  tenant_id    TEXT NOT NULL REFERENCES tenants(id),
  template_id  TEXT NOT NULL,
  node_id      TEXT NOT NULL,
  runtime      TEXT NOT NULL,
  memory_mb    BIGINT NOT NULL,
  state        TEXT NOT NULL,
  reason       TEXT NOT NULL DEFAULT '',
  claimed      INTEGER NOT NULL DEFAULT 1,
  created_by   TEXT NOT NULL,
  created_at   BIGINT NOT NULL,
  updated_at   BIGINT NOT NULL,
  started_at   BIGINT,
  expires_at   BIGINT NOT NULL,
  max_expires_at BIGINT NOT NULL
);

CREATE INDEX sandboxes_tenant ON sandboxes(tenant_id, state);

CREATE INDEX sandboxes_node ON sandboxes(node_id, state);

CREATE INDEX sandboxes_template ON sandboxes(template_id, state);
