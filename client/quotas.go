package client

import "context"

// QuotaLimits are a tenant's limits (see docs/operations.md, Quotas).
type QuotaLimits struct {
	JoinTokens       int64 `json:"join_tokens"`
	Sandboxes        int64 `json:"sandboxes"`
	WarmMemoryMB     int64 `json:"warm_memory_mb"`
	CommandsInFlight int64 `json:"commands_in_flight"`
}

// Quotas are a tenant's effective limits; the root tenant is Exempt.
type Quotas struct {
	TenantID string      `json:"tenant_id"`
	Limits   QuotaLimits `json:"limits"`
	Exempt   bool        `json:"exempt"`
}

// QuotaOverrides are the limits tenants.setQuotas changes: a nil field
// keeps the tenant's current limit (or, with reset, the default).
type QuotaOverrides struct {
	JoinTokens       *int64 `json:"join_tokens,omitempty"`
	Sandboxes        *int64 `json:"sandboxes,omitempty"`
	WarmMemoryMB     *int64 `json:"warm_memory_mb,omitempty"`
	CommandsInFlight *int64 `json:"commands_in_flight,omitempty"`
}

// Quotas reads a tenant's limits ("" for the caller's own tenant).
func (c *Client) Quotas(ctx context.Context, tenant string) (Quotas, error) {
	var out Quotas
	err := c.Call(ctx, "tenants.getQuotas", map[string]any{"id": tenant}, &out)
	return out, err
}

// SetQuotas sets a tenant's limits (root operators only); reset returns
// every limit not given to the default.
func (c *Client) SetQuotas(ctx context.Context, tenant string, o QuotaOverrides, reset bool) (Quotas, error) {
	var out Quotas
	err := c.Call(ctx, "tenants.setQuotas", map[string]any{"id": tenant, "limits": o, "reset": reset}, &out)
	return out, err
}

// Limit is a helper for QuotaOverrides fields.
func Limit(n int64) *int64 { return &n }
