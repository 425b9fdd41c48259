-- Schema version 38 (0038_bastions.sql), the bastions module's part: it names
-- only the bastions module's tables. store.Migrate applies every module's part
-- of a version in one transaction, in the module order of
-- internal/store/modules.go.

-- A bastion is a node of role bastion (its id is the node id): a person's own
-- machine that dials out and serves gated lanes in a WireGuard tunnel. Its WG
-- public key is recorded at its first hello; its tunnel address is allocated
-- then, once, from 100.100.0.0/16 (100.100.0.1 is the control plane's).
CREATE TABLE bastions (
  node_id         TEXT PRIMARY KEY REFERENCES nodes(id),
  tenant_id       TEXT NOT NULL REFERENCES tenants(id),
  name            TEXT NOT NULL,
  wg_public_key   TEXT UNIQUE,
  tunnel_addr     TEXT UNIQUE,
  state           TEXT NOT NULL,
  created_at_ms   BIGINT NOT NULL,
  unpaired_at_ms  BIGINT
);

CREATE INDEX bastions_tenant ON bastions(tenant_id, name);

-- Grants: what the control plane may do on a bastion, signed by the grant
-- key (a note, internal/bastion/grant). The lists are kept as JSON text to
-- show them; the bastion reads only the signed bytes.
CREATE TABLE bastion_grants (
  id             TEXT PRIMARY KEY,
  tenant_id      TEXT NOT NULL REFERENCES tenants(id),
  bastion_id     TEXT NOT NULL REFERENCES bastions(node_id),
  signed         BLOB NOT NULL,
  allow_json     TEXT NOT NULL,
  deny_json      TEXT NOT NULL,
  models_json    TEXT NOT NULL,
  reach_json     TEXT NOT NULL,
  created_at_ms  BIGINT NOT NULL,
  expires_at_ms  BIGINT NOT NULL,
  revoked_at_ms  BIGINT,
  created_by     TEXT NOT NULL
);

CREATE INDEX bastion_grants_bastion ON bastion_grants(bastion_id, expires_at_ms);

-- The control plane's own bastion keys: 'grant' (the note signing key of
-- grants) and 'lanes' (its WireGuard key). The private half is sealed under
-- the key-encryption key, bound to the row's name; KEK rotation reseals it.
CREATE TABLE bastion_keys (
  name           TEXT PRIMARY KEY,
  sealed         BLOB NOT NULL,
  public_key     TEXT NOT NULL,
  created_at_ms  BIGINT NOT NULL
);
