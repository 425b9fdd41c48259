package apitypes

// QuotaLimits are a tenant's limits (see docs/operations.md, Quotas). The
// server converts quota.Limits to it, so the two cannot drift apart.
type QuotaLimits struct {
	JoinTokens       int64 `json:"join_tokens"`
	Sandboxes        int64 `json:"sandboxes"`
	WarmMemoryMB     int64 `json:"warm_memory_mb"`
	CommandsInFlight int64 `json:"commands_in_flight"`
}

// QuotaOverrides are the limits tenants.setQuotas changes: a nil field
// keeps the tenant's current limit (or, with reset, the default). The
// server converts it to quota.Overrides; each bound is quota.MaxLimit
// (TestWireBoundsMatchModules in package api holds them equal).
type QuotaOverrides struct {
	JoinTokens       *int64 `json:"join_tokens,omitempty" api:"min=0,max=1099511627776"`
	Sandboxes        *int64 `json:"sandboxes,omitempty" api:"min=0,max=1099511627776"`
	WarmMemoryMB     *int64 `json:"warm_memory_mb,omitempty" api:"min=0,max=1099511627776"`
	CommandsInFlight *int64 `json:"commands_in_flight,omitempty" api:"min=0,max=1099511627776"`
}

// QuotaSetIn is tenants.setQuotas' input; Reset returns every limit not
// given to the default.
type QuotaSetIn struct {
	ID     string         `json:"id" api:"max=64"`
	Limits QuotaOverrides `json:"limits"`
	Reset  bool           `json:"reset"`
}

// Quotas is the answer of tenants.getQuotas and tenants.setQuotas: a
// tenant's effective limits; the root tenant is Exempt.
type Quotas struct {
	Exempt   bool        `json:"exempt"`
	Limits   QuotaLimits `json:"limits"`
	TenantID string      `json:"tenant_id"`
}
