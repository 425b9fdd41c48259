// Package iam is access control: tenants form a tree under the root tenant
// (id "root"); identities (people and agents) belong to a tenant; roles
// hold allow and deny statements over action and resource patterns; a
// binding gives an identity a role in a tenant and everything below it.
// Decisions read only the control plane's own records, never the request,
// and a deny always beats an allow.
package iam

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"regexp"
	"time"

	"github.com/bettercompute/bettercompute/internal/apikeys"
	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/store"
)

// RootTenant is the id of the tenant at the top of the tree.
const RootTenant = "root"

// Tenant states.
const (
	StateActive    = "active"
	StateSuspended = "suspended"
	StateDeleted   = "deleted"
)

// Service is the iam module.
type Service struct {
	db  *store.DB
	clk clock.Clock
}

// New returns the iam module.
func New(db *store.DB, clk clock.Clock) *Service { return &Service{db: db, clk: clk} }

// Tenant is a tenant as the API shows it.
type Tenant struct {
	ID       string `json:"id"`
	ParentID string `json:"parent_id,omitempty"`
	Name     string `json:"name"`
	State    string `json:"state"`
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// ValidName reports whether s is an acceptable tenant, identity or role name.
func ValidName(s string) bool { return nameRE.MatchString(s) }

// CreateTenant makes a tenant under parent (root when empty).
func (s *Service) CreateTenant(ctx context.Context, actor audit.Entry, parent, name string) (Tenant, error) {
	if parent == "" {
		parent = RootTenant
	}
	if !ValidName(name) {
		return Tenant{}, errs.New(errs.InvalidInput, "name: lowercase letters, digits, '.', '_' or '-', at most 63")
	}
	t := Tenant{ID: ids.New("t"), ParentID: parent, Name: name, State: StateActive}
	now := s.clk.Now()
	err := s.db.Tx(ctx, func(tx *sql.Tx) error {
		var st string
		if err := tx.QueryRowContext(ctx, `SELECT state FROM tenants WHERE id = $1`, parent).Scan(&st); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return errs.New(errs.InvalidInput, "parent_id: no such tenant")
			}
			return fmt.Errorf("iam: read parent: %w", err)
		}
		if st != StateActive {
			return errs.New(errs.InvalidState, "parent_id: the parent tenant is not active")
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO tenants (id, parent_id, name, state, created_at) VALUES ($1, $2, $3, $4, $5)`,
			t.ID, parent, name, StateActive, now.UnixMilli()); err != nil {
			return fmt.Errorf("iam: insert tenant: %w", err)
		}
		actor.Action, actor.Resource, actor.Outcome = "compute:tenants:create", "tenant/"+t.ID, "allowed"
		actor.Details = map[string]any{"parent_id": parent, "name": name}
		return audit.Record(ctx, tx, now, actor)
	})
	return t, err
}

// SetTenantState suspends, resumes (active) or deletes a tenant. The root
// tenant cannot change state.
func (s *Service) SetTenantState(ctx context.Context, actor audit.Entry, id, state string) (Tenant, error) {
	if id == RootTenant {
		return Tenant{}, errs.New(errs.InvalidState, "the root tenant cannot be suspended or deleted")
	}
	verb := map[string]string{StateActive: "resume", StateSuspended: "suspend", StateDeleted: "delete"}[state]
	if verb == "" {
		return Tenant{}, errs.New(errs.InvalidInput, "state: active, suspended or deleted")
	}
	now := s.clk.Now()
	var t Tenant
	err := s.db.Tx(ctx, func(tx *sql.Tx) error {
		var parent sql.NullString
		if err := tx.QueryRowContext(ctx, `SELECT id, parent_id, name, state FROM tenants WHERE id = $1`, id).Scan(&t.ID, &parent, &t.Name, &t.State); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return errs.New(errs.NotFound, "tenant not found")
			}
			return fmt.Errorf("iam: read tenant: %w", err)
		}
		t.ParentID = parent.String
		if t.State == StateDeleted {
			return errs.New(errs.InvalidState, "the tenant is deleted")
		}
		if _, err := tx.ExecContext(ctx, `UPDATE tenants SET state = $1 WHERE id = $2`, state, id); err != nil {
			return fmt.Errorf("iam: set state: %w", err)
		}
		t.State = state
		actor.Action, actor.Resource, actor.Outcome = "compute:tenants:"+verb, "tenant/"+id, "allowed"
		return audit.Record(ctx, tx, now, actor)
	})
	return t, err
}

// Chain returns the tenant and its ancestors up to the root, nearest first.
// An unknown tenant returns an empty chain.
func (s *Service) Chain(ctx context.Context, tenant string) ([]Tenant, error) {
	st, err := s.db.Stmt(ctx, `WITH RECURSIVE chain(id, parent_id, name, state, depth) AS (
			SELECT id, parent_id, name, state, 0 FROM tenants WHERE id = $1
			UNION ALL
			SELECT t.id, t.parent_id, t.name, t.state, c.depth + 1 FROM tenants t JOIN chain c ON t.id = c.parent_id WHERE c.depth < 32
		) SELECT id, parent_id, name, state FROM chain ORDER BY depth`)
	if err != nil {
		return nil, err
	}
	rows, err := st.QueryContext(ctx, tenant)
	if err != nil {
		return nil, fmt.Errorf("iam: tenant chain: %w", err)
	}
	defer rows.Close()
	var out []Tenant
	for rows.Next() {
		var t Tenant
		var parent sql.NullString
		if err := rows.Scan(&t.ID, &parent, &t.Name, &t.State); err != nil {
			return nil, fmt.Errorf("iam: scan chain: %w", err)
		}
		t.ParentID = parent.String
		out = append(out, t)
	}
	return out, rows.Err()
}

// EffectiveState is the tenant's state as calls see it: deleted if it or
// an ancestor is deleted, suspended if it or an ancestor is suspended.
func EffectiveState(chain []Tenant) string {
	st := StateActive
	for _, t := range chain {
		switch t.State {
		case StateDeleted:
			return StateDeleted
		case StateSuspended:
			st = StateSuspended
		}
	}
	if len(chain) == 0 {
		return StateDeleted
	}
	return st
}

// Within reports whether tenant is ancestor or a tenant below it (the
// subtree a binding in ancestor applies to). It reads only the tenant
// tree, and nothing when the two are the same; an unknown tenant is
// within nothing.
func (s *Service) Within(ctx context.Context, ancestor, tenant string) (bool, error) {
	if tenant == ancestor {
		return true, nil
	}
	chain, err := s.Chain(ctx, tenant)
	if err != nil {
		return false, err
	}
	for _, t := range chain {
		if t.ID == ancestor {
			return true, nil
		}
	}
	return false, nil
}

// ListTenants returns the tenants below (and including) under.
func (s *Service) ListTenants(ctx context.Context, under string) ([]Tenant, error) {
	rows, err := s.db.QueryContext(ctx, `WITH RECURSIVE sub(id, parent_id, name, state, depth) AS (
			SELECT id, parent_id, name, state, 0 FROM tenants WHERE id = $1
			UNION ALL
			SELECT t.id, t.parent_id, t.name, t.state, s.depth + 1 FROM tenants t JOIN sub s ON t.parent_id = s.id WHERE s.depth < 32
		) SELECT id, parent_id, name, state FROM sub ORDER BY depth, name`, under)
	if err != nil {
		return nil, fmt.Errorf("iam: list tenants: %w", err)
	}
	defer rows.Close()
	out := []Tenant{}
	for rows.Next() {
		var t Tenant
		var parent sql.NullString
		if err := rows.Scan(&t.ID, &parent, &t.Name, &t.State); err != nil {
			return nil, fmt.Errorf("iam: scan tenant: %w", err)
		}
		t.ParentID = parent.String
		out = append(out, t)
	}
	return out, rows.Err()
}

// Identity is a person or an agent in a tenant.
type Identity struct {
	ID       string `json:"id"`
	TenantID string `json:"tenant_id"`
	Name     string `json:"name"`
	Kind     string `json:"kind"` // person or agent
}

// CreateIdentity makes an identity in tenant.
func (s *Service) CreateIdentity(ctx context.Context, actor audit.Entry, tenant, name, kind string) (Identity, error) {
	if kind == "" {
		kind = "person"
	}
	if kind != "person" && kind != "agent" {
		return Identity{}, errs.New(errs.InvalidInput, "kind: person or agent")
	}
	if !ValidName(name) {
		return Identity{}, errs.New(errs.InvalidInput, "name: lowercase letters, digits, '.', '_' or '-', at most 63")
	}
	id := Identity{ID: ids.New("i"), TenantID: tenant, Name: name, Kind: kind}
	now := s.clk.Now()
	err := s.db.Tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO identities (id, tenant_id, name, kind, created_at) VALUES ($1, $2, $3, $4, $5)`,
			id.ID, tenant, name, kind, now.UnixMilli()); err != nil {
			if store.IsUniqueViolation(err) {
				return errs.New(errs.Conflict, "name: an identity of that name exists in the tenant")
			}
			return fmt.Errorf("iam: insert identity: %w", err)
		}
		actor.Action, actor.Resource, actor.Outcome = "compute:identities:create", "identity/"+id.ID, "allowed"
		actor.Details = map[string]any{"name": name, "kind": kind}
		return audit.Record(ctx, tx, now, actor)
	})
	return id, err
}

// DeleteIdentity removes an identity of tenant with its bindings, and
// revokes its API keys and sessions, and every key and session they made
// (apikeys.RevokeMadeBy), in the same transaction, so nothing it held or
// made still authenticates. An identity cannot delete itself
// (INVALID_STATE); NOT_FOUND when tenant has no such identity.
func (s *Service) DeleteIdentity(ctx context.Context, actor audit.Entry, tenant, id string) error {
	if id == actor.Actor {
		return errs.New(errs.InvalidState, "an identity cannot delete itself")
	}
	now := s.clk.Now()
	return s.db.Tx(ctx, func(tx *sql.Tx) error {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM identities WHERE id = $1 AND tenant_id = $2`, id, tenant).Scan(&n); err != nil {
			return fmt.Errorf("iam: read identity: %w", err)
		}
		if n != 1 {
			return errs.New(errs.NotFound, "identity not found")
		}
		at := now.UnixMilli()
		// Its keys and sessions, and then everything they made (keys it
		// made for other identities included), are revoked.
		var made []string
		for _, q := range []string{
			`SELECT id FROM api_keys WHERE identity = $1 AND revoked_at IS NULL`,
			`SELECT id FROM sessions WHERE identity_id = $1 AND revoked_at IS NULL`,
		} {
			rows, err := tx.QueryContext(ctx, q, id)
			if err != nil {
				return fmt.Errorf("iam: read credentials: %w", err)
			}
			for rows.Next() {
				var c string
				if err := rows.Scan(&c); err != nil {
					rows.Close()
					return fmt.Errorf("iam: read credentials: %w", err)
				}
				made = append(made, c)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return fmt.Errorf("iam: read credentials: %w", err)
			}
		}
		for _, st := range []struct {
			q    string
			args []any
		}{
			{`DELETE FROM bindings WHERE identity_id = $1`, []any{id}},
			{`UPDATE api_keys SET revoked_at = $1 WHERE identity = $2 AND revoked_at IS NULL`, []any{at, id}},
			{`UPDATE sessions SET revoked_at = $1 WHERE identity_id = $2 AND revoked_at IS NULL`, []any{at, id}},
			{`DELETE FROM identities WHERE id = $1`, []any{id}},
		} {
			if _, err := tx.ExecContext(ctx, st.q, st.args...); err != nil {
				return fmt.Errorf("iam: delete identity: %w", err)
			}
		}
		if _, _, err := apikeys.RevokeMadeBy(ctx, tx, s.db.Dialect, at, made); err != nil {
			return err
		}
		actor.Action, actor.Resource, actor.Outcome = "compute:identities:delete", "identity/"+id, "allowed"
		return audit.Record(ctx, tx, now, actor)
	})
}

// Identity reads an identity; NOT_FOUND when absent.
func (s *Service) Identity(ctx context.Context, id string) (Identity, error) {
	var i Identity
	err := s.db.QueryRowContext(ctx, `SELECT id, tenant_id, name, kind FROM identities WHERE id = $1`, id).Scan(&i.ID, &i.TenantID, &i.Name, &i.Kind)
	if errors.Is(err, sql.ErrNoRows) {
		return Identity{}, errs.New(errs.NotFound, "identity not found")
	}
	if err != nil {
		return Identity{}, fmt.Errorf("iam: read identity: %w", err)
	}
	return i, nil
}

// ListIdentities returns a tenant's identities.
func (s *Service) ListIdentities(ctx context.Context, tenant string) ([]Identity, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, tenant_id, name, kind FROM identities WHERE tenant_id = $1 ORDER BY name`, tenant)
	if err != nil {
		return nil, fmt.Errorf("iam: list identities: %w", err)
	}
	defer rows.Close()
	out := []Identity{}
	for rows.Next() {
		var i Identity
		if err := rows.Scan(&i.ID, &i.TenantID, &i.Name, &i.Kind); err != nil {
			return nil, fmt.Errorf("iam: scan identity: %w", err)
		}
		out = append(out, i)
	}
	return out, rows.Err()
}

// Statement is one allow or deny over action and resource patterns. A
// pattern is "*" (everything) or a path.Match pattern, such as
// "compute:nodes:*" or "node/n*".
type Statement struct {
	Effect    string   `json:"effect"` // allow or deny
	Actions   []string `json:"actions"`
	Resources []string `json:"resources"`
}

// Role is a named set of statements.
type Role struct {
	ID         string      `json:"id"`
	TenantID   string      `json:"tenant_id"`
	Name       string      `json:"name"`
	Statements []Statement `json:"statements"`
}

func validateStatements(st []Statement) error {
	if len(st) == 0 || len(st) > 64 {
		return errs.New(errs.InvalidInput, "statements: between 1 and 64")
	}
	for i, s := range st {
		if s.Effect != "allow" && s.Effect != "deny" {
			return errs.New(errs.InvalidInput, fmt.Sprintf("statements[%d].effect: allow or deny", i))
		}
		if len(s.Actions) == 0 || len(s.Resources) == 0 {
			return errs.New(errs.InvalidInput, fmt.Sprintf("statements[%d]: actions and resources are required", i))
		}
		for _, p := range append(append([]string{}, s.Actions...), s.Resources...) {
			if _, err := path.Match(p, ""); err != nil || len(p) > 256 {
				return errs.New(errs.InvalidInput, fmt.Sprintf("statements[%d]: bad pattern", i))
			}
		}
	}
	return nil
}

// CreateRole makes a role in tenant.
func (s *Service) CreateRole(ctx context.Context, actor audit.Entry, tenant, name string, st []Statement) (Role, error) {
	if !ValidName(name) {
		return Role{}, errs.New(errs.InvalidInput, "name: lowercase letters, digits, '.', '_' or '-', at most 63")
	}
	if err := validateStatements(st); err != nil {
		return Role{}, err
	}
	r := Role{ID: ids.New("r"), TenantID: tenant, Name: name, Statements: st}
	b, _ := json.Marshal(st)
	now := s.clk.Now()
	err := s.db.Tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO roles (id, tenant_id, name, statements, created_at) VALUES ($1, $2, $3, $4, $5)`,
			r.ID, tenant, name, string(b), now.UnixMilli()); err != nil {
			if store.IsUniqueViolation(err) {
				return errs.New(errs.Conflict, "name: a role of that name exists in the tenant")
			}
			return fmt.Errorf("iam: insert role: %w", err)
		}
		actor.Action, actor.Resource, actor.Outcome = "compute:roles:create", "role/"+r.ID, "allowed"
		actor.Details = map[string]any{"name": name}
		return audit.Record(ctx, tx, now, actor)
	})
	return r, err
}

// ListRoles returns the roles defined in tenant and its ancestors (roles
// are usable below the tenant that defines them).
func (s *Service) ListRoles(ctx context.Context, tenant string) ([]Role, error) {
	chain, err := s.Chain(ctx, tenant)
	if err != nil {
		return nil, err
	}
	out := []Role{}
	for _, t := range chain {
		rows, err := s.db.QueryContext(ctx, `SELECT id, tenant_id, name, statements FROM roles WHERE tenant_id = $1 ORDER BY name`, t.ID)
		if err != nil {
			return nil, fmt.Errorf("iam: list roles: %w", err)
		}
		for rows.Next() {
			var r Role
			var st string
			if err := rows.Scan(&r.ID, &r.TenantID, &r.Name, &st); err != nil {
				rows.Close()
				return nil, fmt.Errorf("iam: scan role: %w", err)
			}
			if err := json.Unmarshal([]byte(st), &r.Statements); err != nil {
				rows.Close()
				return nil, fmt.Errorf("iam: decode role: %w", err)
			}
			out = append(out, r)
		}
		rows.Close()
	}
	return out, nil
}

// Bind gives identity the role in tenant (and below). The role must be
// defined in tenant or an ancestor, and the identity must belong to tenant
// or a tenant below it: a tenant cannot bind an identity of an ancestor
// (root's admin included) or of another branch. An identity that exists
// elsewhere gets the same answer as one that does not exist, so binding
// is no existence oracle.
func (s *Service) Bind(ctx context.Context, actor audit.Entry, tenant, identityID, roleID string) (string, error) {
	chain, err := s.Chain(ctx, tenant)
	if err != nil {
		return "", err
	}
	inChain := func(t string) bool {
		for _, c := range chain {
			if c.ID == t {
				return true
			}
		}
		return false
	}
	var roleTenant, idTenant string
	if err := s.db.QueryRowContext(ctx, `SELECT tenant_id FROM roles WHERE id = $1`, roleID).Scan(&roleTenant); err != nil || !inChain(roleTenant) {
		return "", errs.New(errs.InvalidInput, "role_id: no such role in this tenant")
	}
	noIdentity := errs.New(errs.InvalidInput, "identity_id: no such identity in this tenant")
	if err := s.db.QueryRowContext(ctx, `SELECT tenant_id FROM identities WHERE id = $1`, identityID).Scan(&idTenant); err != nil {
		if !errors.Is(err, sql.ErrNoRows) {
			return "", fmt.Errorf("iam: read identity: %w", err)
		}
		return "", noIdentity
	}
	if ok, err := s.Within(ctx, tenant, idTenant); err != nil {
		return "", err
	} else if !ok {
		return "", noIdentity
	}
	id := ids.New("b")
	now := s.clk.Now()
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO bindings (id, tenant_id, identity_id, role_id, created_at) VALUES ($1, $2, $3, $4, $5)`,
			id, tenant, identityID, roleID, now.UnixMilli()); err != nil {
			if store.IsUniqueViolation(err) {
				return errs.New(errs.Conflict, "the binding exists")
			}
			return fmt.Errorf("iam: insert binding: %w", err)
		}
		actor.Action, actor.Resource, actor.Outcome = "compute:bindings:create", "binding/"+id, "allowed"
		actor.Details = map[string]any{"identity_id": identityID, "role_id": roleID}
		return audit.Record(ctx, tx, now, actor)
	})
	return id, err
}

// Binding is a binding as the API shows it: identity has role in tenant
// and every tenant below it.
type Binding struct {
	ID             string    `json:"id"`
	TenantID       string    `json:"tenant_id"`
	IdentityID     string    `json:"identity_id"`
	IdentityName   string    `json:"identity_name"`
	IdentityTenant string    `json:"identity_tenant_id"`
	RoleID         string    `json:"role_id"`
	RoleName       string    `json:"role_name"`
	CreatedAt      time.Time `json:"created_at"`
}

// ListBindings returns the bindings made in tenant and in every tenant
// below it, so a parent (root included) finds every binding that can
// affect its subtree.
func (s *Service) ListBindings(ctx context.Context, tenant string) ([]Binding, error) {
	rows, err := s.db.QueryContext(ctx, `WITH RECURSIVE sub(id, depth) AS (
			SELECT id, 0 FROM tenants WHERE id = $1
			UNION ALL
			SELECT t.id, s.depth + 1 FROM tenants t JOIN sub s ON t.parent_id = s.id WHERE s.depth < 32
		) SELECT b.id, b.tenant_id, b.identity_id, i.name, i.tenant_id, b.role_id, r.name, b.created_at
		FROM bindings b JOIN sub ON sub.id = b.tenant_id JOIN identities i ON i.id = b.identity_id JOIN roles r ON r.id = b.role_id
		ORDER BY sub.depth, b.tenant_id, i.name, r.name, b.id`, tenant)
	if err != nil {
		return nil, fmt.Errorf("iam: list bindings: %w", err)
	}
	defer rows.Close()
	out := []Binding{}
	for rows.Next() {
		var b Binding
		var created int64
		if err := rows.Scan(&b.ID, &b.TenantID, &b.IdentityID, &b.IdentityName, &b.IdentityTenant, &b.RoleID, &b.RoleName, &created); err != nil {
			return nil, fmt.Errorf("iam: scan binding: %w", err)
		}
		b.CreatedAt = time.UnixMilli(created).UTC()
		out = append(out, b)
	}
	return out, rows.Err()
}

// Unbind removes a binding of tenant.
func (s *Service) Unbind(ctx context.Context, actor audit.Entry, tenant, bindingID string) error {
	now := s.clk.Now()
	return s.db.Tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM bindings WHERE id = $1 AND tenant_id = $2`, bindingID, tenant)
		if err != nil {
			return fmt.Errorf("iam: delete binding: %w", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return errs.New(errs.NotFound, "binding not found")
		}
		actor.Action, actor.Resource, actor.Outcome = "compute:bindings:delete", "binding/"+bindingID, "allowed"
		return audit.Record(ctx, tx, now, actor)
	})
}

// Decide reports whether identity may perform action on resource (a
// "<type>/<id>" path, or "tenant/<id>" for tenant-level actions) that
// belongs to the tenant whose chain (nearest first) is given. Bindings in
// any tenant of the chain apply; a matching deny beats any allow; no match
// is a deny. scopes, when not empty, further limit the actions (an API
// key's scopes).
func (s *Service) Decide(ctx context.Context, identity, action, resource string, chain []Tenant, scopes []string) (bool, error) {
	if len(chain) == 0 {
		return false, nil
	}
	if len(scopes) > 0 && !matchAny(scopes, action) {
		return false, nil
	}
	// The identity's bindings anywhere in the chain: read them all (an
	// identity has few) and keep those whose tenant is in the chain.
	st, err := s.db.Stmt(ctx, `SELECT b.tenant_id, r.statements, i.tenant_id FROM bindings b JOIN roles r ON r.id = b.role_id JOIN identities i ON i.id = b.identity_id WHERE b.identity_id = $1`)
	if err != nil {
		return false, err
	}
	rows, err := st.QueryContext(ctx, identity)
	if err != nil {
		return false, fmt.Errorf("iam: read bindings: %w", err)
	}
	inChain := make(map[string]bool, len(chain))
	for _, t := range chain {
		inChain[t.ID] = true
	}
	defer rows.Close()
	allowed := false
	type binding struct{ tenant, raw, idTenant string }
	var bs []binding
	for rows.Next() {
		var b binding
		if err := rows.Scan(&b.tenant, &b.raw, &b.idTenant); err != nil {
			return false, fmt.Errorf("iam: scan role: %w", err)
		}
		if inChain[b.tenant] {
			bs = append(bs, b)
		}
	}
	if err := rows.Err(); err != nil {
		return false, fmt.Errorf("iam: read bindings: %w", err)
	}
	rows.Close()
	// A binding counts only in a tenant at or above its identity's own
	// tenant (the rule Bind enforces), so a binding that names an identity
	// of an ancestor, made before that rule or written around it, never
	// applies: no tenant can deny root's admin in its own tenant.
	var idChain map[string]bool
	for _, b := range bs {
		if b.tenant != b.idTenant {
			if idChain == nil {
				c, err := s.Chain(ctx, b.idTenant)
				if err != nil {
					return false, err
				}
				idChain = make(map[string]bool, len(c))
				for _, t := range c {
					idChain[t.ID] = true
				}
			}
			if !idChain[b.tenant] {
				continue
			}
		}
		var st []Statement
		if err := json.Unmarshal([]byte(b.raw), &st); err != nil {
			return false, fmt.Errorf("iam: decode role: %w", err)
		}
		for _, x := range st {
			if !matchAny(x.Actions, action) || !matchAny(x.Resources, resource) {
				continue
			}
			if x.Effect == "deny" {
				return false, nil
			}
			allowed = true
		}
	}
	return allowed, nil
}

func matchAny(patterns []string, s string) bool {
	for _, p := range patterns {
		if p == "*" || p == s {
			return true
		}
		if ok, _ := path.Match(p, s); ok {
			return true
		}
	}
	return false
}
