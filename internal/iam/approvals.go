package iam

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/ids"
)

// Held-back requests: a delegated agent's call of a method that needs its
// person's confirmation is stored here as the text that describes it,
// with that text's SHA-256, keyed by tenant, delegation (the agent),
// action and resource. The person approves or denies it; an approval
// admits exactly one call whose text has the same digest, consumed in the
// statement that admits it, and while it is open (until it expires) a
// call on the same key whose text differs is refused approval-mismatch.

// ApprovalLifetime is how long a held-back request waits for its person,
// and how long an approval stays open once given.
const ApprovalLifetime = 15 * time.Minute

// Approval states.
const (
	ApprovalPending  = "pending"
	ApprovalApproved = "approved"
	ApprovalDenied   = "denied"
	ApprovalUsed     = "used"
)

// ReasonApprovalMismatch is the reason of the refusal of a delegated call
// whose text is not the one an open approval on its key admits.
const ReasonApprovalMismatch = "approval-mismatch"

const (
	approvalCols     = `id, tenant_id, agent_id, person_id, action, resource, method, text, digest, state, created_at, decided_at, decided_by, expires_at`
	qInsertApproval  = `INSERT INTO approvals (id, tenant_id, agent_id, person_id, action, resource, method, text, digest, state, created_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`
	qOpenApprovalsOf = `SELECT ` + approvalCols + ` FROM approvals WHERE tenant_id = $1 AND agent_id = $2 AND action = $3 AND resource = $4 AND expires_at > $5 AND state IN ('pending', 'approved', 'used') ORDER BY created_at, id`
	qUseApproval     = `UPDATE approvals SET state = 'used', used_at = $1 WHERE id = $2 AND state = 'approved' AND digest = $3 AND expires_at > $1`
	qApproval        = `SELECT ` + approvalCols + ` FROM approvals WHERE id = $1 AND tenant_id = $2`
	qDecideApproval  = `UPDATE approvals SET state = $1, decided_at = $2, decided_by = $3, expires_at = $4 WHERE id = $5 AND state = 'pending' AND expires_at > $2`
	qPendingFor      = `SELECT ` + approvalCols + ` FROM approvals WHERE tenant_id = $1 AND person_id = $2 AND state = 'pending' AND expires_at > $3 ORDER BY created_at, id`
)

// Approval is a held-back request as the API shows it.
type Approval struct {
	ID        string     `json:"id"`
	TenantID  string     `json:"tenant_id"`
	AgentID   string     `json:"agent_id"`
	PersonID  string     `json:"person_id"`
	Action    string     `json:"action"`
	Resource  string     `json:"resource"`
	Method    string     `json:"method"`
	Text      string     `json:"text"`
	Digest    string     `json:"digest"` // hex SHA-256 of Text
	State     string     `json:"state"`
	CreatedAt time.Time  `json:"created_at"`
	DecidedAt *time.Time `json:"decided_at,omitempty"`
	DecidedBy string     `json:"decided_by,omitempty"`
	ExpiresAt time.Time  `json:"expires_at"`
}

// ConfirmKey is what a held-back request is keyed by, with the person who
// may approve it and the method (shown, not keyed).
type ConfirmKey struct {
	Tenant, Agent, Person, Action, Resource, Method string
}

// TextDigest is the hex SHA-256 of a request's text.
func TextDigest(text string) string {
	d := sha256.Sum256([]byte(text))
	return hex.EncodeToString(d[:])
}

// Confirm is the held-back request stage for a delegated agent's call
// described by text: admitted (nil) when an approval on k is open with
// text's digest (consumed at once, so it admits this call only);
// ACCESS_DENIED approval-mismatch when an approval on k is open (or was
// used and has not expired) but none admits this text; otherwise the
// request is held (a pending row, reused for the same text) and returned
// with admitted false.
func (s *Service) Confirm(ctx context.Context, actor audit.Entry, k ConfirmKey, text string) (pending Approval, admitted bool, err error) {
	digest, now := TextDigest(text), s.clk.Now()
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		open, err := scanApprovals(tx.QueryContext(ctx, qOpenApprovalsOf, k.Tenant, k.Agent, k.Action, k.Resource, now.UnixMilli()))
		if err != nil {
			return err
		}
		blocked := false
		for _, a := range open {
			switch {
			case a.State == ApprovalApproved && a.Digest == digest:
				if admitted, err = s.useApproval(ctx, tx, actor, a, now); err != nil || admitted {
					return err
				}
				blocked = true
			case a.State == ApprovalApproved || a.State == ApprovalUsed:
				blocked = true
			case a.Digest == digest && pending.ID == "":
				pending = a
			}
		}
		if blocked {
			return errs.New(errs.AccessDenied, ReasonApprovalMismatch+": "+k.Action+" on "+k.Resource+
				" is not what the open approval admits (its text differs, or it was used); ask "+k.Person+" to approve this request once the approval expires")
		}
		if pending.ID != "" {
			return nil
		}
		pending, err = s.holdTx(ctx, tx, actor, k, text, digest, now)
		return err
	})
	return pending, admitted, err
}

// useApproval consumes a (approved, with the call's digest) in tx: true
// when this call took it, false when another call did first.
func (s *Service) useApproval(ctx context.Context, tx *sql.Tx, actor audit.Entry, a Approval, now time.Time) (bool, error) {
	res, err := tx.ExecContext(ctx, qUseApproval, now.UnixMilli(), a.ID, a.Digest)
	if err != nil {
		return false, fmt.Errorf("iam: use approval: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return false, nil
	}
	actor.TenantID, actor.Action, actor.Resource, actor.Outcome = a.TenantID, "compute:approvals:use", "approval/"+a.ID, "allowed"
	actor.Details = map[string]any{"digest": a.Digest, "action": a.Action, "resource": a.Resource, "method": a.Method}
	return true, audit.Record(ctx, tx, now, actor)
}

// holdTx stores a new pending request in tx, audited.
func (s *Service) holdTx(ctx context.Context, tx *sql.Tx, actor audit.Entry, k ConfirmKey, text, digest string, now time.Time) (Approval, error) {
	a := Approval{ID: ids.New("ap_"), TenantID: k.Tenant, AgentID: k.Agent, PersonID: k.Person, Action: k.Action, Resource: k.Resource,
		Method: k.Method, Text: text, Digest: digest, State: ApprovalPending, CreatedAt: now.UTC(), ExpiresAt: now.Add(ApprovalLifetime).UTC()}
	if _, err := tx.ExecContext(ctx, qInsertApproval, a.ID, a.TenantID, a.AgentID, a.PersonID, a.Action, a.Resource, a.Method,
		a.Text, a.Digest, a.State, now.UnixMilli(), a.ExpiresAt.UnixMilli()); err != nil {
		return Approval{}, fmt.Errorf("iam: insert approval: %w", err)
	}
	actor.TenantID, actor.Action, actor.Resource, actor.Outcome = k.Tenant, "compute:approvals:request", "approval/"+a.ID, "held"
	actor.Details = map[string]any{"digest": digest, "action": k.Action, "resource": k.Resource, "method": k.Method, "person_id": k.Person}
	return a, audit.Record(ctx, tx, now, actor)
}

// PendingApprovals returns the requests of tenant waiting for person.
func (s *Service) PendingApprovals(ctx context.Context, tenant, person string) ([]Approval, error) {
	out, err := scanApprovals(s.db.QueryContext(ctx, qPendingFor, tenant, person, s.clk.Now().UnixMilli()))
	if out == nil && err == nil {
		out = []Approval{}
	}
	return out, err
}

// DecideApproval approves or denies the pending request id of tenant. Only
// the person the agent acts for may (ACCESS_DENIED for anyone else, the
// agent included); the delegation must still be live, and the request
// pending and unexpired (INVALID_STATE). An approval stays open for
// ApprovalLifetime from now.
func (s *Service) DecideApproval(ctx context.Context, actor audit.Entry, tenant, id string, approve bool) (Approval, error) {
	now := s.clk.Now()
	state, verb := ApprovalDenied, "deny"
	if approve {
		state, verb = ApprovalApproved, "approve"
	}
	var a Approval
	err := s.db.Tx(ctx, func(tx *sql.Tx) error {
		got, err := scanApprovals(tx.QueryContext(ctx, qApproval, id, tenant))
		if err != nil {
			return err
		}
		if len(got) != 1 {
			return errs.New(errs.NotFound, "approval not found")
		}
		if a = got[0]; a.PersonID != actor.Actor {
			return errs.New(errs.AccessDenied, "only the person the agent acts for ("+a.PersonID+") may approve or deny its request")
		}
		if err := s.liveDelegationTx(ctx, tx, a.AgentID, a.PersonID); err != nil {
			return err
		}
		exp := now.Add(ApprovalLifetime)
		res, err := tx.ExecContext(ctx, qDecideApproval, state, now.UnixMilli(), actor.Actor, exp.UnixMilli(), id)
		if err != nil {
			return fmt.Errorf("iam: decide approval: %w", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return errs.New(errs.InvalidState, "the request is not pending (decided already, or expired)")
		}
		d := now.UTC()
		a.State, a.DecidedAt, a.DecidedBy, a.ExpiresAt = state, &d, actor.Actor, exp.UTC()
		actor.Action, actor.Resource, actor.Outcome = "compute:approvals:"+verb, "approval/"+id, "allowed"
		actor.Details = map[string]any{"digest": a.Digest, "agent_id": a.AgentID, "action": a.Action, "resource": a.Resource, "method": a.Method}
		return audit.Record(ctx, tx, now, actor)
	})
	if err == nil {
		s.accessChanged()
	}
	return a, err
}

// liveDelegationTx checks, in tx, that agent still acts for person.
func (s *Service) liveDelegationTx(ctx context.Context, tx *sql.Tx, agent, person string) error {
	var p string
	var rev sql.NullInt64
	err := tx.QueryRowContext(ctx, qDelegationState, agent).Scan(&p, &rev)
	if errors.Is(err, sql.ErrNoRows) || err == nil && (rev.Valid || p != person) {
		return errs.New(errs.InvalidState, "the agent's delegation is revoked")
	}
	if err != nil {
		return fmt.Errorf("iam: read delegation: %w", err)
	}
	return nil
}

// scanApprovals decodes the rows of an approvals query.
func scanApprovals(rows *sql.Rows, err error) ([]Approval, error) {
	if err != nil {
		return nil, fmt.Errorf("iam: read approvals: %w", err)
	}
	defer rows.Close()
	var out []Approval
	for rows.Next() {
		var a Approval
		var created, expires int64
		var decided sql.NullInt64
		var by sql.NullString
		if err := rows.Scan(&a.ID, &a.TenantID, &a.AgentID, &a.PersonID, &a.Action, &a.Resource, &a.Method, &a.Text, &a.Digest,
			&a.State, &created, &decided, &by, &expires); err != nil {
			return nil, fmt.Errorf("iam: scan approval: %w", err)
		}
		a.CreatedAt, a.ExpiresAt, a.DecidedBy = time.UnixMilli(created).UTC(), time.UnixMilli(expires).UTC(), by.String
		if decided.Valid {
			t := time.UnixMilli(decided.Int64).UTC()
			a.DecidedAt = &t
		}
		out = append(out, a)
	}
	return out, rows.Err()
}
