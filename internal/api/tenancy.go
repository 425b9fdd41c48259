package api

import (
	"context"

	"github.com/bettercompute/bettercompute/internal/iam"
)

// reaches reports whether a non-root caller may act in tenant: its own
// tenant or one below it, as a binding applies in a tenant and everything
// below it. Only the tenant tree is read (nothing for the caller's own
// tenant); an error reads as false, so the call is denied (fail closed)
// and logged.
func (s *Server) reaches(ctx context.Context, c *Caller, tenant string) bool {
	ok, err := s.deps.IAM.Within(ctx, c.HomeTenant, tenant)
	if err != nil {
		s.deps.Log.Warn("tenant tree read failed", "request_id", c.RequestID, "err", err)
		return false
	}
	return ok
}

// actingState refuses a non-root caller acting below its own tenant when
// the tenant it acts in is deleted, or suspended and the method mutates,
// as the envelope refuses that tenant's own callers (TENANT_SUSPENDED).
func actingState(c *Caller, chain []iam.Tenant, mutates bool) error {
	if c.Root() || c.ActingTenant == c.HomeTenant {
		return nil
	}
	return tenantState(iam.EffectiveState(chain), mutates)
}
