package commands

import (
	"context"
	"database/sql"
	"slices"

	"github.com/bettercompute/bettercompute/internal/quota"
)

// admitInFlight admits, inside tx, the new commands of each tenant against
// the commands_in_flight quota of its top-level tenant (summed per
// top-level tenant, in a stable order, so two root fan-outs never wait on
// each other's locks in a cycle).
func (s *Service) admitInFlight(ctx context.Context, tx *sql.Tx, byTenant map[string]int64) error {
	want := map[string]int64{}
	for t, n := range byTenant {
		top, err := s.quotas.TopLevel(ctx, tx, t)
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
		if err := s.quotas.AdmitTracked(ctx, tx, tenant, quota.CommandsInFlight, want[tenant], want[tenant], s.store.countInFlight); err != nil {
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
