-- Schema version 1 (0001_init.sql), the audit module's part: it names only
-- the audit module's tables. store.Migrate applies every module's part of a
-- version in one transaction, in the module order of internal/store/modules.go.

CREATE TABLE audit_events (
  id          TEXT PRIMARY KEY,
  tenant_id   TEXT NOT NULL,
  at          BIGINT NOT NULL,
  actor       TEXT NOT NULL,
  action      TEXT NOT NULL,
  resource    TEXT NOT NULL,
  outcome     TEXT NOT NULL,
  request_id  TEXT NOT NULL DEFAULT '',
  caller      TEXT NOT NULL DEFAULT '',
  details     TEXT NOT NULL DEFAULT '{}'
);

CREATE INDEX audit_events_tenant ON audit_events(tenant_id, at);

CREATE TABLE events (
  id       TEXT PRIMARY KEY,
  at       BIGINT NOT NULL,
  type     TEXT NOT NULL,
  node_id  TEXT NOT NULL DEFAULT '',
  details  TEXT NOT NULL DEFAULT '{}'
);

CREATE INDEX events_type ON events(type, at);
