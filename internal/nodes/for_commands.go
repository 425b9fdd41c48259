package nodes

import (
	"context"
	"fmt"
	"slices"

	"github.com/bettercompute/bettercompute/internal/store"
)

// What the commands module reads of the nodes table, through this API
// rather than its own SQL: a node's tenant and role decide whether a
// caller may queue a command on it and which kinds it runs.

// sqlTenantRoles reads the tenant and role of the nodes of an IN list (the
// list is appended by the caller, one placeholder per id).
const sqlTenantRoles = `SELECT id, tenant_id, role FROM nodes WHERE deleted_at IS NULL AND id IN (`

// TenantRole is a node's tenant and certificate role, neither of which
// changes in the node's life.
type TenantRole struct {
	Tenant string
	Role   string
}

// TenantRoles returns the tenant and role of each node of ids that exists
// (an unknown id is absent from the map), one query per store.InChunk ids.
func (s *Service) TenantRoles(ctx context.Context, ids []string) (map[string]TenantRole, error) {
	out := make(map[string]TenantRole, len(ids))
	for chunk := range slices.Chunk(ids, store.InChunk) {
		a := s.db.NewArgs()
		rows, err := s.db.QueryContext(ctx, sqlTenantRoles+a.Strings(chunk)+`)`, a.Values()...)
		if err != nil {
			return nil, fmt.Errorf("nodes: read tenants and roles: %w", err)
		}
		for rows.Next() {
			var id string
			var r TenantRole
			if err := rows.Scan(&id, &r.Tenant, &r.Role); err != nil {
				rows.Close()
				return nil, fmt.Errorf("nodes: scan tenant and role: %w", err)
			}
			out[id] = r
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("nodes: read tenants and roles: %w", err)
		}
	}
	return out, nil
}
