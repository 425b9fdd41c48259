package bastions

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/bastion/grant"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/ids"
)

// Grant is a grant as the API shows it (never its signature: the signed
// bytes go only to the bastion).
type Grant struct {
	ID        string     `json:"id"`
	BastionID string     `json:"bastion_id"`
	TenantID  string     `json:"tenant_id"`
	Allow     []string   `json:"allow"`
	Deny      []string   `json:"deny"`
	Models    []string   `json:"models"`
	Reach     []string   `json:"reach"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt time.Time  `json:"expires_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
	CreatedBy string     `json:"created_by"`
	Revoked   bool       `json:"revoked"`
	Expired   bool       `json:"expired"`
}

// doc is the grant as it was signed (grant.Effective checks the whole
// document, as the bastion does).
func (g Grant) doc() grant.Doc {
	return grant.Doc{V: 1, ID: g.ID, Bastion: g.BastionID, Allow: g.Allow, Deny: g.Deny, Models: g.Models, Reach: g.Reach,
		IssuedAt: g.CreatedAt.UnixMilli(), ExpiresAt: g.ExpiresAt.UnixMilli()}
}

// orEmpty keeps a list a JSON array, never null.
func orEmpty(l []string) []string {
	if l == nil {
		return []string{}
	}
	return l
}

// Grant signs and stores a grant for bastionID, in scope, with its audit
// row in the same transaction, and pokes the gateway to send it. An
// unknown family (or another bad entry) is INVALID_INPUT naming it; a
// bastion the scope cannot see is NOT_FOUND; an unpaired one
// INVALID_STATE.
func (s *Service) Grant(ctx context.Context, actor audit.Entry, scope iam.Scope, bastionID string, req GrantRequest) (Grant, error) {
	req, err := CheckGrant(req)
	if err != nil {
		return Grant{}, err
	}
	r, err := s.visible(ctx, scope, bastionID)
	if err != nil {
		return Grant{}, err
	}
	if r.state != StatePaired {
		return Grant{}, refuse(errs.InvalidState, ReasonUnpaired, "the bastion is unpaired")
	}
	now := s.clk.Now()
	g := Grant{ID: ids.New("grt_"), BastionID: bastionID, TenantID: r.tenant, Allow: orEmpty(req.Allow), Deny: orEmpty(req.Deny),
		Models: orEmpty(req.Models), Reach: orEmpty(req.Reach), CreatedAt: now.UTC(), ExpiresAt: now.Add(req.TTL).UTC(), CreatedBy: actor.Actor}
	signed, err := s.sign(ctx, g, now)
	if err != nil {
		return Grant{}, err
	}
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		cur, err := s.readRow(ctx, tx, bastionID)
		if err != nil {
			return err
		}
		if cur.state != StatePaired {
			return refuse(errs.InvalidState, ReasonUnpaired, "the bastion is unpaired")
		}
		if err := insertGrant(ctx, tx, g, signed); err != nil {
			return err
		}
		actor.TenantID, actor.Action, actor.Resource, actor.Outcome = r.tenant, "compute:bastions:grant", "bastion/"+bastionID, "allowed"
		actor.Details = map[string]any{"grant_id": g.ID, "allow": g.Allow, "deny": g.Deny, "models": g.Models, "reach": g.Reach,
			"expires_at": g.ExpiresAt.UnixMilli()}
		return audit.Record(ctx, tx, now, actor)
	})
	if err != nil {
		return Grant{}, err
	}
	s.poke()
	return g, nil
}

// sign makes g's signed note under the grant key.
func (s *Service) sign(ctx context.Context, g Grant, now time.Time) ([]byte, error) {
	skey, err := s.privateKey(ctx, keyGrant)
	if err != nil {
		return nil, err
	}
	defer clear(skey)
	d := grant.Doc{V: 1, ID: g.ID, Bastion: g.BastionID, Allow: g.Allow, Deny: g.Deny, Models: g.Models, Reach: g.Reach,
		IssuedAt: now.UnixMilli(), ExpiresAt: g.ExpiresAt.UnixMilli()}
	msg, err := grant.Sign(string(skey), d)
	if err != nil {
		// CheckGrant passed, so this is a rule the two disagree on.
		return nil, errs.Wrap(errs.InvalidInput, "the grant does not validate", fmt.Errorf("bastions: sign grant: %w", err))
	}
	return msg, nil
}

// insertGrant stores g and its signed bytes.
func insertGrant(ctx context.Context, tx *sql.Tx, g Grant, signed []byte) error {
	js := func(l []string) string { b, _ := json.Marshal(l); return string(b) }
	if _, err := tx.ExecContext(ctx, sqlInsertGrant, g.ID, g.TenantID, g.BastionID, signed, js(g.Allow), js(g.Deny), js(g.Models), js(g.Reach),
		g.CreatedAt.UnixMilli(), g.ExpiresAt.UnixMilli(), g.CreatedBy); err != nil {
		return fmt.Errorf("bastions: insert grant: %w", err)
	}
	return nil
}

// visible returns bastionID's row (recording it at first use) when scope
// sees it; NOT_FOUND as for a missing one otherwise.
func (s *Service) visible(ctx context.Context, scope iam.Scope, bastionID string) (row, error) {
	r, err := s.adopt(ctx, bastionID, errs.NotFound)
	if ReasonOf(err) == ReasonNotBastion || err == nil && !scope.Sees(r.tenant) {
		return row{}, errs.New(errs.NotFound, "bastion not found")
	}
	return r, err
}

// Grants lists bastionID's grants, newest first, with their revoked and
// expired flags; NOT_FOUND for a bastion the scope cannot see.
func (s *Service) Grants(ctx context.Context, scope iam.Scope, bastionID string) ([]Grant, error) {
	if _, err := s.visible(ctx, scope, bastionID); err != nil {
		return nil, err
	}
	return s.queryGrants(ctx, sqlGrantsOf, bastionID)
}

// queryGrants runs q and scans its grants.
func (s *Service) queryGrants(ctx context.Context, q string, args ...any) ([]Grant, error) {
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("bastions: read grants: %w", err)
	}
	defer rows.Close()
	now := s.clk.Now()
	out := []Grant{}
	for rows.Next() {
		g, err := scanGrant(rows, now)
		if err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("bastions: read grants: %w", err)
	}
	return out, nil
}

// scanGrant reads one row of grantColumns.
func scanGrant(rows *sql.Rows, now time.Time) (Grant, error) {
	var g Grant
	var allow, deny, models, reach string
	var created, expires int64
	var revoked sql.NullInt64
	if err := rows.Scan(&g.ID, &g.TenantID, &g.BastionID, &allow, &deny, &models, &reach, &created, &expires, &revoked, &g.CreatedBy); err != nil {
		return g, fmt.Errorf("bastions: read grant: %w", err)
	}
	for _, l := range []struct {
		raw string
		out *[]string
	}{{allow, &g.Allow}, {deny, &g.Deny}, {models, &g.Models}, {reach, &g.Reach}} {
		if err := json.Unmarshal([]byte(l.raw), l.out); err != nil {
			return g, fmt.Errorf("bastions: grant %s: lists: %w", g.ID, err)
		}
		*l.out = orEmpty(*l.out)
	}
	g.CreatedAt, g.ExpiresAt = time.UnixMilli(created).UTC(), time.UnixMilli(expires).UTC()
	if revoked.Valid {
		t := time.UnixMilli(revoked.Int64).UTC()
		g.RevokedAt, g.Revoked = &t, true
	}
	g.Expired = now.UnixMilli() >= expires
	return g, nil
}

// GrantTenantOf resolves a grant's tenant for the API envelope; NOT_FOUND
// when unknown.
func (s *Service) GrantTenantOf(ctx context.Context, id string) (string, error) {
	var tenant, bastion string
	err := s.db.QueryRowContext(ctx, sqlGrantTenant, id).Scan(&tenant, &bastion)
	if errors.Is(err, sql.ErrNoRows) {
		return "", errs.New(errs.NotFound, "grant not found")
	}
	if err != nil {
		return "", fmt.Errorf("bastions: read grant: %w", err)
	}
	return tenant, nil
}

// RevokeGrant revokes grant id of tenant, with its audit row, and pokes the
// gateway to resend the bastion's grants. A grant unknown, of another
// tenant or already revoked is NOT_FOUND.
func (s *Service) RevokeGrant(ctx context.Context, actor audit.Entry, tenant, id string) error {
	now := s.clk.Now()
	err := s.db.Tx(ctx, func(tx *sql.Tx) error {
		var owner, bastion string
		if err := tx.QueryRowContext(ctx, sqlGrantTenant, id).Scan(&owner, &bastion); err != nil && !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("bastions: read grant: %w", err)
		}
		res, err := tx.ExecContext(ctx, sqlRevokeGrant, now.UnixMilli(), id, tenant)
		if err != nil {
			return fmt.Errorf("bastions: revoke grant: %w", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return errs.New(errs.NotFound, "grant not found or already revoked")
		}
		actor.TenantID, actor.Action, actor.Resource, actor.Outcome = tenant, "compute:bastions:grant", "bastion/"+bastion, "allowed"
		actor.Details = map[string]any{"op": "revoke", "grant_id": id}
		return audit.Record(ctx, tx, now, actor)
	})
	if err != nil {
		return err
	}
	s.poke()
	return nil
}

// SignedGrants returns the signed bytes of bastionID's live grants
// (unrevoked, unexpired), oldest first, for the gateway to send. A node
// that is not a bastion, or an unpaired bastion, is refused
// (ACCESS_DENIED): it gets no grant.
func (s *Service) SignedGrants(ctx context.Context, bastionID string) ([][]byte, error) {
	if err := s.mustBePaired(ctx, bastionID); err != nil {
		return nil, err
	}
	rows, err := s.db.QueryContext(ctx, sqlLiveSigned, bastionID, s.clk.Now().UnixMilli())
	if err != nil {
		return nil, fmt.Errorf("bastions: read grants: %w", err)
	}
	defer rows.Close()
	out := [][]byte{}
	for rows.Next() {
		var b []byte
		if err := rows.Scan(&b); err != nil {
			return nil, fmt.Errorf("bastions: read grants: %w", err)
		}
		out = append(out, b)
	}
	return out, rows.Err()
}

// mustBePaired refuses (ACCESS_DENIED) a node that is not a live bastion
// (ReasonNotBastion) and an unpaired bastion (ReasonUnpaired).
func (s *Service) mustBePaired(ctx context.Context, bastionID string) error {
	if _, err := s.bastionNode(ctx, bastionID, errs.AccessDenied); err != nil {
		return err
	}
	r, err := s.readRow(ctx, s.db.DB, bastionID)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	if r.state != StatePaired {
		return refuse(errs.AccessDenied, ReasonUnpaired, "")
	}
	return nil
}
