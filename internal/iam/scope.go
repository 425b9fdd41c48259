package iam

import "github.com/bettercompute/bettercompute/internal/store"

// Scope is the tenancy scope of a read or write: the tenant a call acts
// in. The root tenant sees every tenant's rows; any other tenant sees only
// its own. It is the one place the visibility rule is written; modules take
// a Scope rather than a tenant string so that no module spells the rule
// (or the root tenant's id) out again.
//
// The zero Scope sees nothing: a caller that forgot to set one is refused,
// never shown everything.
type Scope struct {
	// Tenant is the tenant the call acts in.
	Tenant string
}

// ScopeOf returns the scope of a call acting in tenant.
func ScopeOf(tenant string) Scope { return Scope{Tenant: tenant} }

// RootScope returns the scope of the root tenant, which sees every
// tenant: for the control plane's own work (sweepers, the dev
// environment), never for a caller's input.
func RootScope() Scope { return Scope{Tenant: RootTenant} }

// Root reports whether the scope is the root tenant's.
func (s Scope) Root() bool { return s.Tenant == RootTenant }

// Sees reports whether a row of tenant is visible in the scope.
func (s Scope) Sees(tenant string) bool {
	if s.Tenant == "" || tenant == "" {
		return false
	}
	return s.Root() || tenant == s.Tenant
}

// Filter returns a SQL condition that keeps the rows of column visible in
// the scope, adding its argument to a: "TRUE" for the root tenant,
// "column = $n" otherwise, and a condition no row meets for the zero
// Scope. column is the caller's own constant, never input.
func (s Scope) Filter(a *store.Args, column string) string {
	switch {
	case s.Tenant == "":
		return "1 = 0"
	case s.Root():
		return "1 = 1"
	}
	return column + " = " + a.Add(s.Tenant)
}

// IsRoot reports whether tenant is the root tenant's id.
func IsRoot(tenant string) bool { return tenant == RootTenant }
