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
	// onAccessChanged is called after each committed change that can
	// narrow access (OnAccessChanged).
	onAccessChanged func()
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
		if err := tx.QueryRowContext(ctx, qTenantState, parent).Scan(&st); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return errs.New(errs.InvalidInput, "parent_id: no such tenant")
			}
			return fmt.Errorf("iam: read parent: %w", err)
		}
		if st != StateActive {
			return errs.New(errs.InvalidState, "parent_id: the parent tenant is not active")
		}
		// Chain and the subtree walk (a deletion's teardown among them) go
		// chainDepth levels: a deeper tenant would reach neither its
		// ancestors' state nor a deleted ancestor's teardown.
		chain, err := ChainIn(ctx, tx, parent, chainDepth)
		if err != nil {
			return err
		}
		if len(chain) == 0 || len(chain) > chainDepth || chain[len(chain)-1].ID != RootTenant {
			return errs.New(errs.InvalidInput, fmt.Sprintf("parent_id: tenants nest at most %d levels below the root tenant", chainDepth))
		}
		if _, err := tx.ExecContext(ctx, qInsertTenant, t.ID, parent, name, StateActive, now.UnixMilli()); err != nil {
			if store.IsUniqueViolation(err) {
				return errs.New(errs.Conflict, "name: the parent tenant already has a tenant of that name (choose another, or use the existing one)")
			}
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
		var err error
		if t, err = scanTenant(tx.QueryRowContext(ctx, qTenant, id)); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return errs.New(errs.NotFound, "tenant not found")
			}
			return fmt.Errorf("iam: read tenant: %w", err)
		}
		if t.State == StateDeleted {
			return errs.New(errs.InvalidState, "the tenant is deleted")
		}
		if _, err := tx.ExecContext(ctx, qSetTenantState, state, id); err != nil {
			return fmt.Errorf("iam: set state: %w", err)
		}
		t.State = state
		actor.Action, actor.Resource, actor.Outcome = "compute:tenants:"+verb, "tenant/"+id, "allowed"
		return audit.Record(ctx, tx, now, actor)
	})
	if err == nil {
		s.accessChanged()
	}
	return t, err
}

// Chain returns the tenant and its ancestors up to the root, nearest first.
// An unknown tenant returns an empty chain.
func (s *Service) Chain(ctx context.Context, tenant string) ([]Tenant, error) {
	st, err := s.db.Stmt(ctx, qChain)
	if err != nil {
		return nil, err
	}
	rows, err := st.QueryContext(ctx, tenant, chainDepth)
	if err != nil {
		return nil, fmt.Errorf("iam: tenant chain: %w", err)
	}
	return scanTenants(rows, "chain")
}

// ChainIn is Chain read through q (a transaction, for a module that
// decides inside one), walking at most depth levels above tenant.
func ChainIn(ctx context.Context, q Querier, tenant string, depth int) ([]Tenant, error) {
	rows, err := q.QueryContext(ctx, qChain, tenant, depth)
	if err != nil {
		return nil, fmt.Errorf("iam: tenant chain: %w", err)
	}
	return scanTenants(rows, "chain")
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
	rows, err := s.db.QueryContext(ctx, qSubtree, under)
	if err != nil {
		return nil, fmt.Errorf("iam: list tenants: %w", err)
	}
	out, err := scanTenants(rows, "tenant")
	if out == nil && err == nil {
		out = []Tenant{}
	}
	return out, err
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
		if _, err := tx.ExecContext(ctx, qInsertIdentity, id.ID, tenant, name, kind, now.UnixMilli()); err != nil {
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
// (apikeys.RevokeForIdentityTx), in the same transaction, so nothing it
// held or made still authenticates. An identity cannot delete itself
// (INVALID_STATE); NOT_FOUND when tenant has no such identity.
func (s *Service) DeleteIdentity(ctx context.Context, actor audit.Entry, tenant, id string) error {
	if id == actor.Actor {
		return errs.New(errs.InvalidState, "an identity cannot delete itself")
	}
	now := s.clk.Now()
	err := s.db.Tx(ctx, func(tx *sql.Tx) error {
		ok, err := s.IdentityInTenantTx(ctx, tx, id, tenant)
		if err != nil {
			return err
		}
		if !ok {
			return errs.New(errs.NotFound, "identity not found")
		}
		if _, err := tx.ExecContext(ctx, qDeleteBindingsOfIdentity, id); err != nil {
			return fmt.Errorf("iam: delete identity: %w", err)
		}
		if err := dropDelegationsTx(ctx, tx, id, now.UnixMilli()); err != nil {
			return err
		}
		// Its keys and sessions, and then everything they made (keys it
		// made for other identities included), are revoked.
		if err := apikeys.RevokeForIdentityTx(ctx, tx, s.db.Dialect, tenant, id, now.UnixMilli()); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, qDeleteIdentity, id); err != nil {
			return fmt.Errorf("iam: delete identity: %w", err)
		}
		actor.Action, actor.Resource, actor.Outcome = "compute:identities:delete", "identity/"+id, "allowed"
		return audit.Record(ctx, tx, now, actor)
	})
	if err == nil {
		s.accessChanged()
	}
	return err
}

// ExistsCondition returns an SQL condition, true when the identity in
// idColumn exists in the tenant in tenantColumn, for a module that must
// check it in the same statement as its own read (apikeys' authentication:
// one round trip a call). The columns are the caller's constants.
func (s *Service) ExistsCondition(idColumn, tenantColumn string) string {
	return fmt.Sprintf(qIdentityExistsCondition, idColumn, tenantColumn)
}

// IdentityInTenantTx reports, inside tx, whether identity id exists in
// tenant (apikeys asks it when it makes a key, in the same transaction).
func (s *Service) IdentityInTenantTx(ctx context.Context, tx *sql.Tx, id, tenant string) (bool, error) {
	return identityInTenant(tx.QueryRowContext(ctx, qIdentityInTenant, id, tenant))
}

func identityInTenant(row *sql.Row) (bool, error) {
	var n int
	if err := row.Scan(&n); err != nil {
		return false, fmt.Errorf("iam: read identity: %w", err)
	}
	return n == 1, nil
}

// Identity reads an identity; NOT_FOUND when absent.
func (s *Service) Identity(ctx context.Context, id string) (Identity, error) {
	i, err := scanIdentity(s.db.QueryRowContext(ctx, qIdentity, id))
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
	rows, err := s.db.QueryContext(ctx, qListIdentities, tenant)
	if err != nil {
		return nil, fmt.Errorf("iam: list identities: %w", err)
	}
	defer rows.Close()
	out := []Identity{}
	for rows.Next() {
		i, err := scanIdentity(rows)
		if err != nil {
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
		if _, err := tx.ExecContext(ctx, qInsertRole, r.ID, tenant, name, string(b), now.UnixMilli()); err != nil {
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
		rows, err := s.db.QueryContext(ctx, qRolesOf, t.ID)
		if err != nil {
			return nil, fmt.Errorf("iam: list roles: %w", err)
		}
		if out, err = scanRoles(rows, out); err != nil {
			return nil, err
		}
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
	var roleTenant, idTenant string
	if err := s.db.QueryRowContext(ctx, qRoleTenant, roleID).Scan(&roleTenant); err != nil || !tenantSet(chain)[roleTenant] {
		return "", errs.New(errs.InvalidInput, "role_id: no such role in this tenant")
	}
	noIdentity := errs.New(errs.InvalidInput, "identity_id: no such identity in this tenant")
	if err := s.db.QueryRowContext(ctx, qIdentityTenant, identityID).Scan(&idTenant); err != nil {
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
		if _, err := tx.ExecContext(ctx, qInsertBinding, id, tenant, identityID, roleID, now.UnixMilli()); err != nil {
			if store.IsUniqueViolation(err) {
				return errs.New(errs.Conflict, "the binding exists")
			}
			return fmt.Errorf("iam: insert binding: %w", err)
		}
		actor.Action, actor.Resource, actor.Outcome = "compute:bindings:create", "binding/"+id, "allowed"
		actor.Details = map[string]any{"identity_id": identityID, "role_id": roleID}
		return audit.Record(ctx, tx, now, actor)
	})
	if err == nil {
		// A role may deny: a new binding can narrow access too.
		s.accessChanged()
	}
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
	rows, err := s.db.QueryContext(ctx, qListBindings, tenant)
	if err != nil {
		return nil, fmt.Errorf("iam: list bindings: %w", err)
	}
	defer rows.Close()
	out := []Binding{}
	for rows.Next() {
		b, err := scanBinding(rows)
		if err != nil {
			return nil, fmt.Errorf("iam: scan binding: %w", err)
		}
		out = append(out, b)
	}
	return out, rows.Err()
}

// Unbind removes a binding of tenant.
func (s *Service) Unbind(ctx context.Context, actor audit.Entry, tenant, bindingID string) error {
	now := s.clk.Now()
	err := s.db.Tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, qDeleteBinding, bindingID, tenant)
		if err != nil {
			return fmt.Errorf("iam: delete binding: %w", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return errs.New(errs.NotFound, "binding not found")
		}
		actor.Action, actor.Resource, actor.Outcome = "compute:bindings:delete", "binding/"+bindingID, "allowed"
		return audit.Record(ctx, tx, now, actor)
	})
	if err == nil {
		s.accessChanged()
	}
	return err
}

// Decide reports whether identity may perform action on resource (a
// "<type>/<id>" path, or "tenant/<id>" for tenant-level actions) that
// belongs to the tenant whose chain (nearest first) is given. Bindings in
// any tenant of the chain apply; a matching deny beats any allow; no match
// is a deny. scopes, when not empty, further limit the actions (an API
// key's scopes). It reads the identity's bindings and decides with
// Evaluate. A suspended identity is allowed nothing; an agent with a
// delegation is allowed only what its person's bindings allow too, and
// nothing once the delegation is revoked or its person suspended.
func (s *Service) Decide(ctx context.Context, identity, action, resource string, chain []Tenant, scopes []string) (bool, error) {
	req := Request{Action: action, Resource: resource, Scopes: scopes}
	if !req.possible(chain) {
		return false, nil
	}
	ok, err := s.decideOwn(ctx, identity, req, chain)
	if err != nil || !ok {
		return false, err
	}
	st, err := s.stateOf(ctx, identity)
	switch {
	case err != nil:
		return false, err
	case st.suspended:
		return false, nil
	case !st.delegated:
		return true, nil
	case st.revoked || st.personSuspended:
		return false, nil
	}
	return s.decideOwn(ctx, st.person, req, chain)
}

// decideOwn is the decision on identity's own bindings alone.
func (s *Service) decideOwn(ctx context.Context, identity string, req Request, chain []Tenant) (bool, error) {
	grants, idChain, err := s.grants(ctx, identity, chain)
	if err != nil {
		return false, err
	}
	return Evaluate(req, chain, idChain, grants), nil
}

// grants reads the identity's bindings that apply in chain, with their
// roles' statements, and the identity's own tenant chain when a binding
// is made outside the identity's tenant (nil otherwise).
func (s *Service) grants(ctx context.Context, identity string, chain []Tenant) ([]Grant, []Tenant, error) {
	rows, err := s.grantRows(ctx, identity, tenantSet(chain))
	if err != nil {
		return nil, nil, err
	}
	var idChain []Tenant
	for _, r := range rows {
		if r.tenant != r.idTenant {
			// Every row names the same identity, so one chain serves all.
			if idChain, err = s.Chain(ctx, r.idTenant); err != nil {
				return nil, nil, err
			}
			break
		}
	}
	inChain, ids := tenantSet(chain), tenantSet(idChain)
	var out []Grant
	for _, r := range rows {
		if !grantApplies(r.tenant, r.idTenant, inChain, ids) {
			continue
		}
		g := Grant{Tenant: r.tenant, IdentityTenant: r.idTenant}
		if err := json.Unmarshal([]byte(r.raw), &g.Statements); err != nil {
			return nil, nil, fmt.Errorf("iam: decode role: %w", err)
		}
		out = append(out, g)
	}
	return out, idChain, nil
}

// grantRows reads the identity's bindings (an identity has few) and keeps
// those made in a tenant of inChain.
func (s *Service) grantRows(ctx context.Context, identity string, inChain map[string]bool) ([]grantRow, error) {
	st, err := s.db.Stmt(ctx, qGrantsOf)
	if err != nil {
		return nil, err
	}
	rows, err := st.QueryContext(ctx, identity)
	if err != nil {
		return nil, fmt.Errorf("iam: read bindings: %w", err)
	}
	defer rows.Close()
	var out []grantRow
	for rows.Next() {
		g, err := scanGrantRow(rows)
		if err != nil {
			return nil, fmt.Errorf("iam: scan role: %w", err)
		}
		if inChain[g.tenant] {
			out = append(out, g)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("iam: read bindings: %w", err)
	}
	return out, nil
}
