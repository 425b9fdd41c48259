package iam

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"
)

// The iam module owns the tenants, identities, roles and bindings tables;
// this file holds every statement it runs on them and their row codecs.
// Other modules reach these tables only through the package's API
// (Chain, ChainIn, IdentityInTenantTx, ExistsCondition, SubtreeCondition).

// chainDepth bounds the tenant chain Chain walks above a tenant.
const chainDepth = 32

// SubtreeCondition is an SQL condition on a row's tenant_id column: the
// tenant $1 or any tenant under it (down to 64 levels). Modules
// that count their own rows per subtree (quota counters) embed it, so the
// tenant tree is walked by iam's SQL alone.
const SubtreeCondition = `tenant_id IN (WITH RECURSIVE quota_sub(id, depth) AS (
		SELECT id, 0 FROM tenants WHERE id = $1
		UNION ALL
		SELECT t.id, q.depth + 1 FROM tenants t JOIN quota_sub q ON t.parent_id = q.id WHERE q.depth < 64
	) SELECT id FROM quota_sub)`

const (
	qTenantState    = `SELECT state FROM tenants WHERE id = $1`
	qInsertTenant   = `INSERT INTO tenants (id, parent_id, name, state, created_at) VALUES ($1, $2, $3, $4, $5)`
	qTenant         = `SELECT id, parent_id, name, state FROM tenants WHERE id = $1`
	qSetTenantState = `UPDATE tenants SET state = $1 WHERE id = $2`
	qChain          = `WITH RECURSIVE chain(id, parent_id, name, state, depth) AS (
			SELECT id, parent_id, name, state, 0 FROM tenants WHERE id = $1
			UNION ALL
			SELECT t.id, t.parent_id, t.name, t.state, c.depth + 1 FROM tenants t JOIN chain c ON t.id = c.parent_id WHERE c.depth < $2
		) SELECT id, parent_id, name, state FROM chain ORDER BY depth`
	qSubtree = `WITH RECURSIVE sub(id, parent_id, name, state, depth) AS (
			SELECT id, parent_id, name, state, 0 FROM tenants WHERE id = $1
			UNION ALL
			SELECT t.id, t.parent_id, t.name, t.state, s.depth + 1 FROM tenants t JOIN sub s ON t.parent_id = s.id WHERE s.depth < 32
		) SELECT id, parent_id, name, state FROM sub ORDER BY depth, name`

	qInsertIdentity   = `INSERT INTO identities (id, tenant_id, name, kind, created_at) VALUES ($1, $2, $3, $4, $5)`
	qIdentityInTenant = `SELECT COUNT(*) FROM identities WHERE id = $1 AND tenant_id = $2`
	// qIdentityExistsCondition takes the identity and tenant columns of
	// the statement it is put in.
	qIdentityExistsCondition = `EXISTS (SELECT 1 FROM identities ix WHERE ix.id = %s AND ix.tenant_id = %s)`
	qIdentity                = `SELECT id, tenant_id, name, kind FROM identities WHERE id = $1`
	qIdentityTenant          = `SELECT tenant_id FROM identities WHERE id = $1`
	qListIdentities          = `SELECT id, tenant_id, name, kind FROM identities WHERE tenant_id = $1 ORDER BY name`
	qDeleteIdentity          = `DELETE FROM identities WHERE id = $1`

	qInsertRole = `INSERT INTO roles (id, tenant_id, name, statements, created_at) VALUES ($1, $2, $3, $4, $5)`
	qRolesOf    = `SELECT id, tenant_id, name, statements FROM roles WHERE tenant_id = $1 ORDER BY name`
	qRoleTenant = `SELECT tenant_id FROM roles WHERE id = $1`

	qInsertBinding            = `INSERT INTO bindings (id, tenant_id, identity_id, role_id, created_at) VALUES ($1, $2, $3, $4, $5)`
	qDeleteBinding            = `DELETE FROM bindings WHERE id = $1 AND tenant_id = $2`
	qDeleteBindingsOfIdentity = `DELETE FROM bindings WHERE identity_id = $1`
	qGrantsOf                 = `SELECT b.tenant_id, r.statements, i.tenant_id FROM bindings b JOIN roles r ON r.id = b.role_id JOIN identities i ON i.id = b.identity_id WHERE b.identity_id = $1`
	qListBindings             = `WITH RECURSIVE sub(id, depth) AS (
			SELECT id, 0 FROM tenants WHERE id = $1
			UNION ALL
			SELECT t.id, s.depth + 1 FROM tenants t JOIN sub s ON t.parent_id = s.id WHERE s.depth < 32
		) SELECT b.id, b.tenant_id, b.identity_id, i.name, i.tenant_id, b.role_id, r.name, b.created_at
		FROM bindings b JOIN sub ON sub.id = b.tenant_id JOIN identities i ON i.id = b.identity_id JOIN roles r ON r.id = b.role_id
		ORDER BY sub.depth, b.tenant_id, i.name, r.name, b.id`
)

// Querier is what the package's transaction-aware reads need: a
// *store.DB or a *sql.Tx.
type Querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

type scanner interface{ Scan(dest ...any) error }

// scanTenant decodes a row of (id, parent_id, name, state).
func scanTenant(s scanner) (Tenant, error) {
	var t Tenant
	var parent sql.NullString
	if err := s.Scan(&t.ID, &parent, &t.Name, &t.State); err != nil {
		return Tenant{}, err
	}
	t.ParentID = parent.String
	return t, nil
}

// scanTenants decodes every row of a tenant query; what names the read in
// errors.
func scanTenants(rows *sql.Rows, what string) ([]Tenant, error) {
	defer rows.Close()
	var out []Tenant
	for rows.Next() {
		t, err := scanTenant(rows)
		if err != nil {
			return nil, fmt.Errorf("iam: scan %s: %w", what, err)
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// scanIdentity decodes a row of (id, tenant_id, name, kind).
func scanIdentity(s scanner) (Identity, error) {
	var i Identity
	err := s.Scan(&i.ID, &i.TenantID, &i.Name, &i.Kind)
	return i, err
}

// scanRoles decodes rows of (id, tenant_id, name, statements) into out.
func scanRoles(rows *sql.Rows, out []Role) ([]Role, error) {
	defer rows.Close()
	for rows.Next() {
		var r Role
		var st string
		if err := rows.Scan(&r.ID, &r.TenantID, &r.Name, &st); err != nil {
			return nil, fmt.Errorf("iam: scan role: %w", err)
		}
		if err := json.Unmarshal([]byte(st), &r.Statements); err != nil {
			return nil, fmt.Errorf("iam: decode role: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// scanBinding decodes a row of qListBindings.
func scanBinding(s scanner) (Binding, error) {
	var b Binding
	var created int64
	if err := s.Scan(&b.ID, &b.TenantID, &b.IdentityID, &b.IdentityName, &b.IdentityTenant, &b.RoleID, &b.RoleName, &created); err != nil {
		return Binding{}, err
	}
	b.CreatedAt = time.UnixMilli(created).UTC()
	return b, nil
}

// grantRow is one of an identity's bindings as Decide reads it: the tenant
// it is made in, its role's statements (JSON, decoded only when the
// binding applies) and the identity's own tenant.
type grantRow struct{ tenant, raw, idTenant string }

func scanGrantRow(s scanner) (grantRow, error) {
	var g grantRow
	err := s.Scan(&g.tenant, &g.raw, &g.idTenant)
	return g, err
}
