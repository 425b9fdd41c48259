package bastions

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/bastion/grant"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/store"
)

// Summary is a bastion as bastions.list shows it.
type Summary struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Connected bool   `json:"connected"`
	// Families are the effective families of its live grants (deny beats
	// allow); none for an unpaired bastion.
	Families []string `json:"families"`
}

// Bastion is one bastion as bastions.get shows it.
type Bastion struct {
	Summary
	TenantID   string `json:"tenant_id"`
	State      string `json:"state"`
	TunnelAddr string `json:"tunnel_addr,omitempty"`
	// WGKeyFingerprint names its WireGuard public key (Fingerprint).
	WGKeyFingerprint string     `json:"wg_key_fingerprint,omitempty"`
	Grants           int        `json:"grants"` // live grants
	CreatedAt        time.Time  `json:"created_at"`
	UnpairedAt       *time.Time `json:"unpaired_at,omitempty"`
}

// List returns the bastions visible in scope, in name order: every node of
// role bastion (its connected flag from the nodes module's session
// registry) with the families its live grants leave allowed.
func (s *Service) List(ctx context.Context, scope iam.Scope) ([]Summary, error) {
	ns, err := s.nodes.List(ctx, scope)
	if err != nil {
		return nil, err
	}
	var ids []string
	out := []Summary{}
	for _, n := range ns {
		if n.Role == pki.RoleBastion && scope.Sees(n.TenantID) {
			ids = append(ids, n.ID)
			out = append(out, Summary{ID: n.ID, Name: n.Name, Connected: n.Connected})
		}
	}
	rows, err := s.rowsOf(ctx, ids)
	if err != nil {
		return nil, err
	}
	fams, _, err := s.families(ctx, ids)
	if err != nil {
		return nil, err
	}
	for i := range out {
		out[i].Families = []string{}
		if r, ok := rows[out[i].ID]; !ok || r.state == StatePaired {
			out[i].Families = orEmpty(fams[out[i].ID])
		}
	}
	return out, nil
}

// Get returns one bastion; NOT_FOUND when the scope cannot see it.
func (s *Service) Get(ctx context.Context, scope iam.Scope, id string) (Bastion, error) {
	r, err := s.visible(ctx, scope, id)
	if err != nil {
		return Bastion{}, err
	}
	n, err := s.nodes.Get(ctx, scope, id)
	if err != nil {
		return Bastion{}, err
	}
	fams, counts, err := s.families(ctx, []string{id})
	if err != nil {
		return Bastion{}, err
	}
	b := Bastion{Summary: Summary{ID: id, Name: r.name, Connected: n.Connected, Families: []string{}}, TenantID: r.tenant, State: r.state,
		TunnelAddr: r.addr.String, WGKeyFingerprint: Fingerprint(r.wgKey.String), Grants: counts[id], CreatedAt: time.UnixMilli(r.createdAt).UTC()}
	if r.state == StatePaired {
		b.Families = orEmpty(fams[id])
	}
	if r.unpairedAt.Valid {
		t := time.UnixMilli(r.unpairedAt.Int64).UTC()
		b.UnpairedAt = &t
	}
	return b, nil
}

// rowsOf reads the rows of the bastions of ids that have one.
func (s *Service) rowsOf(ctx context.Context, ids []string) (map[string]row, error) {
	out := map[string]row{}
	for len(ids) > 0 {
		chunk := ids[:min(len(ids), store.InChunk)]
		ids = ids[len(chunk):]
		a := s.db.NewArgs()
		rows, err := s.db.QueryContext(ctx, sqlBastionsOf+a.Strings(chunk)+`)`, a.Values()...)
		if err != nil {
			return nil, fmt.Errorf("bastions: read bastions: %w", err)
		}
		for rows.Next() {
			var r row
			if err := rows.Scan(&r.id, &r.tenant, &r.name, &r.wgKey, &r.addr, &r.state, &r.createdAt, &r.unpairedAt); err != nil {
				rows.Close()
				return nil, fmt.Errorf("bastions: read bastions: %w", err)
			}
			out[r.id] = r
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("bastions: read bastions: %w", err)
		}
	}
	return out, nil
}

// families returns, per bastion of ids, the effective families of its live
// grants and how many live grants it has.
func (s *Service) families(ctx context.Context, ids []string) (map[string][]string, map[string]int, error) {
	now := s.clk.Now()
	docs := map[string][]grant.Doc{}
	for len(ids) > 0 {
		chunk := ids[:min(len(ids), store.InChunk)]
		ids = ids[len(chunk):]
		a := s.db.NewArgs()
		a.Add(now.UnixMilli())
		gs, err := s.queryGrants(ctx, sqlLiveGrantsIn+a.Strings(chunk)+`)`, a.Values()...)
		if err != nil {
			return nil, nil, err
		}
		for _, g := range gs {
			docs[g.BastionID] = append(docs[g.BastionID], g.doc())
		}
	}
	fams, counts := map[string][]string{}, map[string]int{}
	for id, ds := range docs {
		fams[id], counts[id] = EffectiveFamilies(ds, now), len(ds)
	}
	return fams, counts, nil
}

// Unpair unpairs bastion id for good: its state becomes unpaired (its hello
// and grants are refused from then on, its peer leaves the tunnel), with
// the audit row in the same transaction; then every certificate of it is
// revoked through the nodes module (its mutual-TLS session is refused),
// and the gateway and lanes role are poked. Unpairing an unpaired bastion
// again revokes again (a retry after a failed revocation finishes it).
func (s *Service) Unpair(ctx context.Context, actor audit.Entry, scope iam.Scope, id string) error {
	r, err := s.visible(ctx, scope, id)
	if err != nil {
		return err
	}
	now := s.clk.Now()
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, sqlUnpair, now.UnixMilli(), id)
		if err != nil {
			return fmt.Errorf("bastions: unpair: %w", err)
		}
		n, _ := res.RowsAffected()
		e := actor
		e.TenantID, e.Action, e.Resource, e.Outcome = r.tenant, "compute:bastions:unpair", "bastion/"+id, "allowed"
		e.Details = map[string]any{"already_unpaired": n == 0}
		return audit.Record(ctx, tx, now, e)
	})
	if err != nil {
		return err
	}
	defer s.poke()
	if _, err := s.nodes.Revoke(ctx, actor, id, "", ReasonUnpairedCert); err != nil {
		return errs.Wrap(errs.Internal, "the bastion is unpaired but its certificates were not all revoked; unpair it again", fmt.Errorf("bastions: revoke: %w", err))
	}
	return nil
}
