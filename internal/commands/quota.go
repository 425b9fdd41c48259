package commands

import (
	"context"
	"database/sql"
	"slices"

	"github.com/bettercompute/bettercompute/internal/quota"
)

// UseQuotas sets the quota service (the server wires the configured one);
// without it the default limits apply.
func (s *Service) UseQuotas(q *quota.Service) { s.quotas = q }

// countInFlight counts the commands that are queued, sent or running of a
// top-level tenant ($1) and every tenant under it.
const countInFlight = `SELECT COUNT(*) FROM commands WHERE ` + quota.InSubtree + ` AND state IN ($2, $3, $4)`

// admitInFlight admits, inside tx, the new commands of each tenant against
// the commands_in_flight quota of its top-level tenant (summed per
// top-level tenant, in a stable order, so two root fan-outs never wait on
// each other's locks in a cycle).
func (s *Service) admitInFlight(ctx context.Context, tx *sql.Tx, byTenant map[string]int64) error {
	q := s.quotas
	if q == nil {
		q = quota.New(s.db, s.clk, quota.Defaults())
	}
	want := map[string]int64{}
	for t, n := range byTenant {
		top, err := quota.TopLevel(ctx, tx, t)
		if err != nil {
			return err
		}
		want[top] += n
	}
	tenants := make([]string, 0, len(want))
	for t := range want {
		tenants = append(tenants, t)
	}
	slices.Sort(tenants)
	for _, tenant := range tenants {
		err := q.AdmitTracked(ctx, tx, tenant, quota.CommandsInFlight, want[tenant], want[tenant], func(ctx context.Context, tx *sql.Tx, top string) (int64, error) {
			var n int64
			err := tx.QueryRowContext(ctx, countInFlight, top, StateQueued, StateSent, StateRunning).Scan(&n)
			return n, err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// perTenant counts cs by tenant.
func perTenant(cs []Command) map[string]int64 {
	out := map[string]int64{}
	for _, c := range cs {
		out[c.TenantID]++
	}
	return out
}
