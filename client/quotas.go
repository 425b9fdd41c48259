package client

import (
	"context"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
)

// QuotaLimits are a tenant's limits (see docs/operations.md, Quotas).
type QuotaLimits = apitypes.QuotaLimits

// Quotas are a tenant's effective limits; the root tenant is Exempt.
type Quotas = apitypes.Quotas

// QuotaOverrides are the limits tenants.setQuotas changes: a nil field
// keeps the tenant's current limit (or, with reset, the default).
type QuotaOverrides = apitypes.QuotaOverrides

// Quotas reads a tenant's limits ("" for the caller's own tenant).
func (c *Client) Quotas(ctx context.Context, tenant string) (Quotas, error) {
	var out Quotas
	err := c.Call(ctx, "tenants.getQuotas", apitypes.IDIn{ID: tenant}, &out)
	return out, err
}

// SetQuotas sets a tenant's limits (root operators only); reset returns
// every limit not given to the default.
func (c *Client) SetQuotas(ctx context.Context, tenant string, o QuotaOverrides, reset bool) (Quotas, error) {
	var out Quotas
	err := c.Call(ctx, "tenants.setQuotas", apitypes.QuotaSetIn{ID: tenant, Limits: o, Reset: reset}, &out)
	return out, err
}

// Limit is a helper for QuotaOverrides fields.
func Limit(n int64) *int64 { return &n }
