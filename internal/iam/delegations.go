package iam

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/store"
)

// Delegations: an agent identity acts for a person of its tenant. The
// agent's effective permissions are at most its person's (Decide allows
// it an action only when both allow it), its held-back requests wait for
// that person's approval (approvals.go), and a revoked delegation leaves
// the agent refused everything. Nothing here is cached: every decision
// reads the delegation, so a change is seen by the next call in every
// process; the change still pokes OnAccessChanged for the caches others
// keep.

const (
	qInsertDelegation = `INSERT INTO delegations (agent_id, tenant_id, person_id, created_by, created_at) VALUES ($1, $2, $3, $4, $5)`
	qDelegationOf     = `SELECT d.agent_id, d.tenant_id, d.person_id, d.created_at, d.revoked_at, a.name, COALESCE(p.name, '')
		FROM delegations d JOIN identities a ON a.id = d.agent_id LEFT JOIN identities p ON p.id = d.person_id WHERE d.agent_id = $1`
	qDelegationsIn = `SELECT d.agent_id, d.tenant_id, d.person_id, d.created_at, d.revoked_at, a.name, COALESCE(p.name, '')
		FROM delegations d JOIN identities a ON a.id = d.agent_id LEFT JOIN identities p ON p.id = d.person_id WHERE d.tenant_id = $1 ORDER BY a.name`
	qDelegationState = `SELECT person_id, revoked_at FROM delegations WHERE agent_id = $1`
	qIdentityState   = `SELECT i.suspended_at, d.person_id, d.revoked_at, p.suspended_at FROM identities i
		LEFT JOIN delegations d ON d.agent_id = i.id LEFT JOIN identities p ON p.id = d.person_id WHERE i.id = $1`
	qSuspendIdentity     = `UPDATE identities SET suspended_at = $1 WHERE id = $2 AND tenant_id = $3`
	qRevokeDelegation    = `UPDATE delegations SET revoked_at = $1 WHERE agent_id = $2 AND tenant_id = $3 AND revoked_at IS NULL`
	qRevokeDelegationsOf = `UPDATE delegations SET revoked_at = $1 WHERE person_id = $2 AND revoked_at IS NULL`
	qDeleteDelegationOf  = `DELETE FROM delegations WHERE agent_id = $1`
	qIdentityKindIn      = `SELECT kind FROM identities WHERE id = $1 AND tenant_id = $2`
	qConfirmKinds        = `SELECT kind FROM confirm_kinds WHERE tenant_id = $1 ORDER BY kind`
	qDeleteConfirmKinds  = `DELETE FROM confirm_kinds WHERE tenant_id = $1`
	qInsertConfirmKind   = `INSERT INTO confirm_kinds (tenant_id, kind) VALUES ($1, $2)`
)

// Delegation is an agent's delegation as the API shows it.
type Delegation struct {
	AgentID    string     `json:"agent_id"`
	AgentName  string     `json:"agent_name"`
	TenantID   string     `json:"tenant_id"`
	PersonID   string     `json:"person_id"`
	PersonName string     `json:"person_name"`
	CreatedAt  time.Time  `json:"created_at"`
	RevokedAt  *time.Time `json:"revoked_at,omitempty"`
}

// Active reports whether the delegation still lets its agent act.
func (d Delegation) Active() bool { return d.RevokedAt == nil }

// CreateAgentFor makes an agent identity in tenant that acts for the
// person forPerson, in one transaction with its delegation and audit row.
// forPerson must be a person of the same tenant: an identity of another
// tenant answers like a missing one (INVALID_INPUT, no existence oracle),
// an agent is refused with its own message.
func (s *Service) CreateAgentFor(ctx context.Context, actor audit.Entry, tenant, name, forPerson string) (Identity, error) {
	if !ValidName(name) {
		return Identity{}, errs.New(errs.InvalidInput, "name: lowercase letters, digits, '.', '_' or '-', at most 63")
	}
	id := Identity{ID: ids.New("i"), TenantID: tenant, Name: name, Kind: "agent"}
	now := s.clk.Now()
	err := s.db.Tx(ctx, func(tx *sql.Tx) error {
		var kind string
		switch err := tx.QueryRowContext(ctx, qIdentityKindIn, forPerson, tenant).Scan(&kind); {
		case errors.Is(err, sql.ErrNoRows):
			return errs.New(errs.InvalidInput, "for: no such person in this tenant (an agent acts for a person of its own tenant)")
		case err != nil:
			return fmt.Errorf("iam: read person: %w", err)
		case kind != "person":
			return errs.New(errs.InvalidInput, "for: the identity is an agent; an agent acts only for a person")
		}
		if _, err := tx.ExecContext(ctx, qInsertIdentity, id.ID, tenant, name, "agent", now.UnixMilli()); err != nil {
			if store.IsUniqueViolation(err) {
				return errs.New(errs.Conflict, "name: an identity of that name exists in the tenant")
			}
			return fmt.Errorf("iam: insert identity: %w", err)
		}
		if _, err := tx.ExecContext(ctx, qInsertDelegation, id.ID, tenant, forPerson, actor.Actor, now.UnixMilli()); err != nil {
			return fmt.Errorf("iam: insert delegation: %w", err)
		}
		actor.Action, actor.Resource, actor.Outcome = "compute:identities:create", "identity/"+id.ID, "allowed"
		actor.Details = map[string]any{"name": name, "kind": "agent", "for": forPerson}
		return audit.Record(ctx, tx, now, actor)
	})
	if err == nil {
		s.accessChanged()
	}
	return id, err
}

// DelegationOf returns the agent's delegation (revoked or not); ok is
// false when the identity has none.
func (s *Service) DelegationOf(ctx context.Context, agent string) (d Delegation, ok bool, err error) {
	d, err = scanDelegation(s.db.QueryRowContext(ctx, qDelegationOf, agent))
	if errors.Is(err, sql.ErrNoRows) {
		return Delegation{}, false, nil
	}
	if err != nil {
		return Delegation{}, false, fmt.Errorf("iam: read delegation: %w", err)
	}
	return d, true, nil
}

// ListDelegations returns the delegations of tenant's agents.
func (s *Service) ListDelegations(ctx context.Context, tenant string) ([]Delegation, error) {
	rows, err := s.db.QueryContext(ctx, qDelegationsIn, tenant)
	if err != nil {
		return nil, fmt.Errorf("iam: list delegations: %w", err)
	}
	defer rows.Close()
	out := []Delegation{}
	for rows.Next() {
		d, err := scanDelegation(rows)
		if err != nil {
			return nil, fmt.Errorf("iam: scan delegation: %w", err)
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// RevokeDelegation revokes the delegation of agent, an agent of tenant:
// from then on the agent is refused every action (it is not freed of its
// person's limits). NOT_FOUND when tenant has no such live delegation.
func (s *Service) RevokeDelegation(ctx context.Context, actor audit.Entry, tenant, agent string) error {
	now := s.clk.Now()
	err := s.db.Tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, qRevokeDelegation, now.UnixMilli(), agent, tenant)
		if err != nil {
			return fmt.Errorf("iam: revoke delegation: %w", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return errs.New(errs.NotFound, "delegation not found (or already revoked)")
		}
		actor.Action, actor.Resource, actor.Outcome = "compute:delegations:revoke", "identity/"+agent, "allowed"
		return audit.Record(ctx, tx, now, actor)
	})
	if err == nil {
		s.accessChanged()
	}
	return err
}

// dropDelegationsTx is DeleteIdentity's part: a deleted agent's
// delegation goes with it, and a deleted person's agents' delegations are
// revoked (their rows stay, so those agents stay refused rather than
// freed of their person's limits).
func dropDelegationsTx(ctx context.Context, tx *sql.Tx, id string, now int64) error {
	if _, err := tx.ExecContext(ctx, qDeleteDelegationOf, id); err != nil {
		return fmt.Errorf("iam: delete delegation: %w", err)
	}
	if _, err := tx.ExecContext(ctx, qRevokeDelegationsOf, now, id); err != nil {
		return fmt.Errorf("iam: revoke delegations: %w", err)
	}
	return nil
}

// identityState is what Decide reads besides the bindings, in one
// statement: whether identity is suspended, and, when it has a delegation,
// its person, whether the delegation is revoked and whether the person is
// suspended. It is read for every decision: it is not cached.
type identityState struct {
	suspended, delegated, revoked, personSuspended bool
	person                                         string
}

// stateOf reads identity's identityState (a missing identity reads as
// not suspended and not delegated: it has no bindings either).
func (s *Service) stateOf(ctx context.Context, identity string) (identityState, error) {
	st, err := s.db.Stmt(ctx, qIdentityState)
	if err != nil {
		return identityState{}, err
	}
	var susp, rev, pSusp sql.NullInt64
	var person sql.NullString
	switch err := st.QueryRowContext(ctx, identity).Scan(&susp, &person, &rev, &pSusp); {
	case errors.Is(err, sql.ErrNoRows):
		return identityState{}, nil
	case err != nil:
		return identityState{}, fmt.Errorf("iam: read identity state: %w", err)
	}
	return identityState{suspended: susp.Valid, delegated: person.Valid, revoked: rev.Valid, personSuspended: pSusp.Valid, person: person.String}, nil
}

// SetSuspended suspends (or resumes) identity id of tenant: a suspended
// identity is refused every decision, and so are the agents acting for a
// suspended person. An identity cannot suspend itself (INVALID_STATE);
// NOT_FOUND when tenant has no such identity.
func (s *Service) SetSuspended(ctx context.Context, actor audit.Entry, tenant, id string, suspend bool) error {
	if id == actor.Actor {
		return errs.New(errs.InvalidState, "an identity cannot suspend or resume itself")
	}
	now := s.clk.Now()
	var at any
	verb := "resume"
	if suspend {
		at, verb = now.UnixMilli(), "suspend"
	}
	err := s.db.Tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, qSuspendIdentity, at, id, tenant)
		if err != nil {
			return fmt.Errorf("iam: suspend identity: %w", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return errs.New(errs.NotFound, "identity not found")
		}
		actor.Action, actor.Resource, actor.Outcome = "compute:identities:"+verb, "identity/"+id, "allowed"
		return audit.Record(ctx, tx, now, actor)
	})
	if err == nil {
		s.accessChanged()
	}
	return err
}

// ConfirmKinds returns the command kinds tenant holds back for its
// agents' persons' confirmation, sorted.
func (s *Service) ConfirmKinds(ctx context.Context, tenant string) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, qConfirmKinds, tenant)
	if err != nil {
		return nil, fmt.Errorf("iam: read confirm kinds: %w", err)
	}
	defer rows.Close()
	out := []string{}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, fmt.Errorf("iam: scan confirm kind: %w", err)
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// SetConfirmKinds replaces the command kinds tenant holds back (an empty
// list holds none back), audited with the new list.
func (s *Service) SetConfirmKinds(ctx context.Context, actor audit.Entry, tenant string, kinds []string) ([]string, error) {
	set := map[string]bool{}
	for _, k := range kinds {
		if k == "" || len(k) > 64 {
			return nil, errs.New(errs.InvalidInput, "kinds: each is 1 to 64 characters")
		}
		set[k] = true
	}
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	now := s.clk.Now()
	err := s.db.Tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, qDeleteConfirmKinds, tenant); err != nil {
			return fmt.Errorf("iam: set confirm kinds: %w", err)
		}
		for _, k := range out {
			if _, err := tx.ExecContext(ctx, qInsertConfirmKind, tenant, k); err != nil {
				return fmt.Errorf("iam: set confirm kinds: %w", err)
			}
		}
		actor.Action, actor.Resource, actor.Outcome = "compute:approval-kinds:set", "tenant/"+tenant, "allowed"
		actor.Details = map[string]any{"kinds": out}
		return audit.Record(ctx, tx, now, actor)
	})
	if err == nil {
		s.accessChanged()
	}
	return out, err
}

// scanDelegation decodes a row of qDelegationOf.
func scanDelegation(s scanner) (Delegation, error) {
	var d Delegation
	var created int64
	var revoked sql.NullInt64
	if err := s.Scan(&d.AgentID, &d.TenantID, &d.PersonID, &created, &revoked, &d.AgentName, &d.PersonName); err != nil {
		return Delegation{}, err
	}
	d.CreatedAt = time.UnixMilli(created).UTC()
	if revoked.Valid {
		t := time.UnixMilli(revoked.Int64).UTC()
		d.RevokedAt = &t
	}
	return d, nil
}
