-- Schema version 45 (0045_approvals.sql), the iam module's part: it names only
-- the iam module's tables. store.Migrate applies every module's part of a
-- version in one transaction, in the module order of internal/store/modules.go.

-- Schema version 45: an agent's held-back requests and their approvals.
-- A row is one request an agent made that needs its person's
-- confirmation: the text that describes it and that text's SHA-256,
-- keyed by tenant, delegation (the agent), action and resource. State is
-- pending, approved, denied or used; an approved row admits exactly one
-- call whose text has the same digest (it becomes used in the same
-- statement), and while it is open (until expires_at) a call on the same
-- key whose text differs is refused.

CREATE TABLE approvals (
  id          TEXT PRIMARY KEY,
  tenant_id   TEXT NOT NULL REFERENCES tenants(id),
  agent_id    TEXT NOT NULL,
  person_id   TEXT NOT NULL,
  action      TEXT NOT NULL,
  resource    TEXT NOT NULL,
  method      TEXT NOT NULL,
  text        TEXT NOT NULL,
  digest      TEXT NOT NULL,
  state       TEXT NOT NULL,
  created_at  BIGINT NOT NULL,
  decided_at  BIGINT,
  decided_by  TEXT,
  used_at     BIGINT,
  expires_at  BIGINT NOT NULL
);

CREATE INDEX approvals_key ON approvals(tenant_id, agent_id, action, resource);
CREATE INDEX approvals_person ON approvals(person_id, state);
