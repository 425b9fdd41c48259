package api

import (
	"context"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
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
		Def("tenants.getQuotas", "compute:quotas:get", false, func(in apitypes.IDIn) Target { return Target{Tenant: in.ID} },
			func(ctx context.Context, c *Caller, in apitypes.IDIn) (any, error) {
				if err := exists(ctx, c.ActingTenant); err != nil {
					return nil, err
				}
				l, err := m.Quotas.Limits(ctx, c.ActingTenant)
				if err != nil {
					return nil, err
				}
				return quotasOut(c.ActingTenant, l), nil
			}),
		Def("tenants.setQuotas", "compute:quotas:set", true, func(apitypes.QuotaSetIn) Target { return Target{Tenant: iam.RootTenant} },
			func(ctx context.Context, c *Caller, in apitypes.QuotaSetIn) (any, error) {
				if in.ID == "" {
					return nil, errs.New(errs.InvalidInput, "id is required")
				}
				if err := exists(ctx, in.ID); err != nil {
					return nil, err
				}
				l, err := m.Quotas.Set(ctx, c.Actor(), in.ID, quota.Overrides(in.Limits), in.Reset)
				if err != nil {
					return nil, err
				}
				return quotasOut(in.ID, l), nil
			}),
	}
}

// quotasOut is the quota methods' answer for tenant with limits l. The
// conversion to apitypes.QuotaLimits (and from apitypes.QuotaOverrides)
// compiles only while the wire types have the quota module's fields.
func quotasOut(tenant string, l quota.Limits) apitypes.Quotas {
	return apitypes.Quotas{Exempt: quota.Exempt(tenant), Limits: apitypes.QuotaLimits(l), TenantID: tenant}
}
