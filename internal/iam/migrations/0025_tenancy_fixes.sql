-- Schema version 25 (0025_tenancy_fixes.sql), the iam module's part: it names only
-- the iam module's tables. store.Migrate applies every module's part of a
-- version in one transaction, in the module order of internal/store/modules.go.

-- Schema version 25: quotas held by top-level tenants, and keys that die
-- with the credential that made them.
-- A quota counts the rows of a top-level tenant's whole subtree, walking
-- tenants down by parent_id; the tracked usages counted one tenant's rows
-- only, so they are dropped and recounted at the next admission.
-- api_keys.made_by names the API key (k_...) or session (ss_...) that
-- made the key (NULL: made by the server itself, or before this version);
-- revoking a credential revokes the keys it made, at any depth.

CREATE INDEX tenants_parent ON tenants(parent_id);
