-- Schema version 29 (0029_tenant_names.sql), the iam module's part: it names only
-- the iam module's tables. store.Migrate applies every module's part of a
-- version in one transaction, in the module order of internal/store/modules.go.

-- Schema version 29: a tenant's name is unique among its live siblings, so
-- the CLI can take a tenant's name wherever it takes its id. A deleted
-- tenant's name may be used again. Siblings that already share a name keep
-- it on the oldest; the others become NAME-ID before the index is made.

UPDATE tenants SET name = name || '-' || id
WHERE state <> 'deleted' AND EXISTS (
  SELECT 1 FROM tenants o
  WHERE o.parent_id = tenants.parent_id AND o.name = tenants.name AND o.state <> 'deleted'
    AND (o.created_at < tenants.created_at OR (o.created_at = tenants.created_at AND o.id < tenants.id))
);

CREATE UNIQUE INDEX tenants_parent_name ON tenants(parent_id, name) WHERE state <> 'deleted';
