package iam

import (
	"testing"

	"github.com/bettercompute/bettercompute/internal/store"
)

func TestScopeSees(t *testing.T) {
	for _, tc := range []struct {
		scope  Scope
		tenant string
		want   bool
	}{
		{RootScope(), "root", true},
		{RootScope(), "t-a", true},
		{ScopeOf("t-a"), "t-a", true},
		{ScopeOf("t-a"), "t-b", false},
		{ScopeOf("t-a"), "root", false},
		{ScopeOf("t-a"), "", false},
		{Scope{}, "t-a", false},
		{Scope{}, "", false},
		{RootScope(), "", false},
	} {
		if got := tc.scope.Sees(tc.tenant); got != tc.want {
			t.Errorf("%+v.Sees(%q) = %v, want %v", tc.scope, tc.tenant, got, tc.want)
		}
	}
}

func TestScopeFilter(t *testing.T) {
	for _, tc := range []struct {
		scope Scope
		want  string
		args  int
	}{
		{RootScope(), "1 = 1", 0},
		{ScopeOf("t-a"), "tenant_id = $1", 1},
		{Scope{}, "1 = 0", 0},
	} {
		a := store.NewArgsFor(store.Postgres)
		if got := tc.scope.Filter(a, "tenant_id"); got != tc.want || len(a.Values()) != tc.args {
			t.Errorf("%+v.Filter = %q with %d args, want %q with %d", tc.scope, got, len(a.Values()), tc.want, tc.args)
		}
	}
}
