-- Schema version 2 (0002_iam.sql), the iam module's part: it names only
-- the iam module's tables. store.Migrate applies every module's part of a
-- version in one transaction, in the module order of internal/store/modules.go.

-- Schema version 2: identities, roles, bindings, idempotency and sessions
-- for the API envelope and access control.

CREATE TABLE identities (
  id          TEXT PRIMARY KEY,
  tenant_id   TEXT NOT NULL REFERENCES tenants(id),
  name        TEXT NOT NULL,
  kind        TEXT NOT NULL,
  created_at  BIGINT NOT NULL,
  UNIQUE (tenant_id, name)
);

INSERT INTO identities (id, tenant_id, name, kind, created_at) VALUES ('admin', 'root', 'admin', 'person', 0);

CREATE TABLE roles (
  id          TEXT PRIMARY KEY,
  tenant_id   TEXT NOT NULL REFERENCES tenants(id),
  name        TEXT NOT NULL,
  statements  TEXT NOT NULL,
  created_at  BIGINT NOT NULL,
  UNIQUE (tenant_id, name)
);

INSERT INTO roles (id, tenant_id, name, statements, created_at) VALUES
  ('admin', 'root', 'admin', '[{"effect":"allow","actions":["*"],"resources":["*"]}]', 0),
  ('viewer', 'root', 'viewer', '[{"effect":"allow","actions":["compute:*:get","compute:*:list"],"resources":["*"]}]', 0),
  ('operator', 'root', 'operator', '[{"effect":"allow","actions":["compute:*:get","compute:*:list","compute:commands:create","compute:join-tokens:create"],"resources":["*"]}]', 0);

CREATE TABLE bindings (
  id           TEXT PRIMARY KEY,
  tenant_id    TEXT NOT NULL REFERENCES tenants(id),
  identity_id  TEXT NOT NULL REFERENCES identities(id),
  role_id      TEXT NOT NULL REFERENCES roles(id),
  created_at   BIGINT NOT NULL,
  UNIQUE (tenant_id, identity_id, role_id)
);

CREATE INDEX bindings_identity ON bindings(identity_id);

INSERT INTO bindings (id, tenant_id, identity_id, role_id, created_at) VALUES ('admin', 'root', 'admin', 'admin', 0);
