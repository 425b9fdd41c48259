package api

import (
	"context"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/quota"
)

// quotaMethods read and set tenants' quotas. Only the root tenant sets
// them (tenants.setQuotas is pre-checked as a call in the root tenant, so
// no other tenant's caller gets past the envelope, not even a parent of
// the tenant); a tenant reads its own.
func quotaMethods(m Modules) []Method {
	if m.Quotas == nil {
		return nil
	}
	type getIn struct {
		ID string `json:"id" api:"max=64"`
	}
	type setIn struct {
		ID     string          `json:"id" api:"max=64"`
		Limits quota.Overrides `json:"limits"`
		// Reset returns every limit not given to the default.
		Reset bool `json:"reset"`
	}
	exists := func(ctx context.Context, id string) error {
		chain, err := m.IAM.Chain(ctx, id)
		if err != nil {
			return err
		}
		if id == "" || len(chain) == 0 {
			return errs.New(errs.NotFound, "tenant not found")
		}
		return nil
	}
	return []Method{
		Def("tenants.getQuotas", "compute:quotas:get", false, func(in getIn) Target { return Target{Tenant: in.ID} },
			func(ctx context.Context, c *Caller, in getIn) (any, error) {
				if err := exists(ctx, c.ActingTenant); err != nil {
					return nil, err
				}
				l, err := m.Quotas.Limits(ctx, c.ActingTenant)
				if err != nil {
					return nil, err
				}
				return map[string]any{"tenant_id": c.ActingTenant, "limits": l, "exempt": quota.Exempt(c.ActingTenant)}, nil
			}),
		Def("tenants.setQuotas", "compute:quotas:set", true, func(setIn) Target { return Target{Tenant: iam.RootTenant} },
			func(ctx context.Context, c *Caller, in setIn) (any, error) {
				if in.ID == "" {
					return nil, errs.New(errs.InvalidInput, "id is required")
				}
				if err := exists(ctx, in.ID); err != nil {
					return nil, err
				}
				l, err := m.Quotas.Set(ctx, c.Actor(), in.ID, in.Limits, in.Reset)
				if err != nil {
					return nil, err
				}
				return map[string]any{"tenant_id": in.ID, "limits": l, "exempt": quota.Exempt(in.ID)}, nil
			}),
	}
}
