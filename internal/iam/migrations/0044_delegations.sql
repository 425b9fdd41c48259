-- Schema version 44 (0044_delegations.sql), the iam module's part: it names only
-- the iam module's tables. store.Migrate applies every module's part of a
-- version in one transaction, in the module order of internal/store/modules.go.

-- Schema version 44: delegations and the kinds a tenant holds back.
-- A delegation makes an agent identity act for a person of the same
-- tenant: the agent is allowed an action only when its own bindings and
-- its person's both allow it. A revoked delegation (revoked_at set) keeps
-- its row, so the agent stays refused; an agent has at most one
-- delegation, ever. person_id has no foreign key: deleting the person
-- revokes the delegation and leaves the row.
-- identities.suspended_at, when set, suspends the identity: every
-- decision for it is a deny (and, for an agent's person, for its agents)
-- until it is resumed.
-- confirm_kinds lists, per tenant, the command kinds an agent's
-- commands.create and commands.fanout need its person's confirmation for.

ALTER TABLE identities ADD COLUMN suspended_at BIGINT;

CREATE TABLE delegations (
  agent_id    TEXT PRIMARY KEY,
  tenant_id   TEXT NOT NULL REFERENCES tenants(id),
  person_id   TEXT NOT NULL,
  created_by  TEXT NOT NULL,
  created_at  BIGINT NOT NULL,
  revoked_at  BIGINT
);

CREATE INDEX delegations_person ON delegations(person_id);

CREATE TABLE confirm_kinds (
  tenant_id  TEXT NOT NULL REFERENCES tenants(id),
  kind       TEXT NOT NULL,
  PRIMARY KEY (tenant_id, kind)
);
