package api

import (
	"testing"

	"github.com/bettercompute/bettercompute/internal/apikeys"
	"github.com/bettercompute/bettercompute/internal/iam"
)

// Root is about the caller's home tenant, Scope about the tenant the call
// acts in: a root caller acting in a child reads as the child, a child's
// caller never reads as root.
func TestCallerHomeAndActingTenant(t *testing.T) {
	cases := []struct {
		home, acting string
		root         bool
		scope        iam.Scope
	}{
		{iam.RootTenant, iam.RootTenant, true, iam.RootScope()},
		{iam.RootTenant, "ten_child", true, iam.ScopeOf("ten_child")},
		{"ten_child", "ten_child", false, iam.ScopeOf("ten_child")},
		{"ten_parent", "ten_child", false, iam.ScopeOf("ten_child")},
	}
	for _, c := range cases {
		caller := &Caller{Principal: apikeys.Principal{HomeTenant: c.home}, ActingTenant: c.acting}
		if caller.Root() != c.root || caller.Scope() != c.scope {
			t.Errorf("home %s acting %s: Root %v Scope %+v, want %v %+v", c.home, c.acting, caller.Root(), caller.Scope(), c.root, c.scope)
		}
		if caller.Actor().TenantID != c.acting {
			t.Errorf("home %s acting %s: audit tenant %s", c.home, c.acting, caller.Actor().TenantID)
		}
	}
}
