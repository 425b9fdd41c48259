package iam

import (
	"strings"
	"testing"
)

// The tenant tree of these tests: root > a > kid, and root > b.
var (
	tRoot = Tenant{ID: RootTenant}
	tA    = Tenant{ID: "t_a", ParentID: RootTenant}
	tKid  = Tenant{ID: "t_kid", ParentID: "t_a"}
	tB    = Tenant{ID: "t_b", ParentID: RootTenant}

	chainRoot = []Tenant{tRoot}
	chainA    = []Tenant{tA, tRoot}
	chainKid  = []Tenant{tKid, tA, tRoot}
	chainB    = []Tenant{tB, tRoot}
)

func allow(actions, resources string) Statement {
	return Statement{Effect: "allow", Actions: strings.Split(actions, ","), Resources: strings.Split(resources, ",")}
}

func deny(actions, resources string) Statement {
	return Statement{Effect: "deny", Actions: strings.Split(actions, ","), Resources: strings.Split(resources, ",")}
}

func grant(tenant, idTenant string, st ...Statement) Grant {
	return Grant{Tenant: tenant, IdentityTenant: idTenant, Statements: st}
}

func TestEvaluate(t *testing.T) {
	read := Request{Action: "compute:nodes:get", Resource: "node/n1"}
	for _, tc := range []struct {
		name    string
		req     Request
		chain   []Tenant
		idChain []Tenant
		grants  []Grant
		want    bool
	}{
		{"no grants is a deny", read, chainA, chainA, nil, false},
		{"an empty chain (unknown tenant) is a deny", read, nil, chainA, []Grant{grant("t_a", "t_a", allow("*", "*"))}, false},
		{"allow in the tenant", read, chainA, chainA, []Grant{grant("t_a", "t_a", allow("compute:nodes:*", "node/*"))}, true},
		{"exact action and resource", read, chainA, chainA, []Grant{grant("t_a", "t_a", allow("compute:nodes:get", "node/n1"))}, true},
		{"action does not match", read, chainA, chainA, []Grant{grant("t_a", "t_a", allow("compute:secrets:*", "*"))}, false},
		{"resource does not match", read, chainA, chainA, []Grant{grant("t_a", "t_a", allow("*", "node/m*"))}, false},
		{"deny beats allow in one role", read, chainA, chainA, []Grant{grant("t_a", "t_a", allow("*", "*"), deny("compute:nodes:get", "*"))}, false},
		{"deny beats allow across roles, deny first", read, chainA, chainA, []Grant{
			grant("t_a", "t_a", deny("*", "node/n1")), grant("t_a", "t_a", allow("*", "*"))}, false},
		{"deny beats allow across roles, allow first", read, chainA, chainA, []Grant{
			grant("t_a", "t_a", allow("*", "*")), grant("t_a", "t_a", deny("*", "node/n1"))}, false},
		{"a deny that does not match leaves the allow", read, chainA, chainA, []Grant{
			grant("t_a", "t_a", allow("*", "*"), deny("*", "node/n2"))}, true},
		{"a binding in an ancestor applies below it", read, chainKid, chainA, []Grant{grant("t_a", "t_a", allow("*", "*"))}, true},
		{"root's binding applies everywhere", read, chainKid, chainRoot, []Grant{grant(RootTenant, RootTenant, allow("*", "*"))}, true},
		{"a binding in a child does not apply above it", read, chainA, chainKid, []Grant{grant("t_kid", "t_kid", allow("*", "*"))}, false},
		{"a binding in another branch does not apply", read, chainB, chainA, []Grant{grant("t_a", "t_a", allow("*", "*"))}, false},
		{"a binding of a lower identity made above it applies", read, chainA, chainKid, []Grant{grant("t_a", "t_kid", allow("*", "*"))}, true},
		{"a binding of an ancestor's identity never applies (allow)", read, chainKid, chainRoot, []Grant{grant("t_kid", RootTenant, allow("*", "*"))}, false},
		{"a binding of an ancestor's identity never applies (deny)", read, chainKid, chainRoot, []Grant{
			grant(RootTenant, RootTenant, allow("*", "*")), grant("t_kid", RootTenant, deny("*", "*"))}, true},
		{"scopes admit the action", Request{Action: "compute:nodes:get", Resource: "node/n1", Scopes: []string{"compute:nodes:*"}}, chainA, chainA,
			[]Grant{grant("t_a", "t_a", allow("*", "*"))}, true},
		{"scopes exclude the action", Request{Action: "compute:nodes:get", Resource: "node/n1", Scopes: []string{"compute:secrets:*"}}, chainA, chainA,
			[]Grant{grant("t_a", "t_a", allow("*", "*"))}, false},
		{"scopes never widen the roles", Request{Action: "compute:nodes:get", Resource: "node/n1", Scopes: []string{"*"}}, chainA, chainA,
			[]Grant{grant("t_a", "t_a", allow("compute:secrets:*", "*"))}, false},
		{"a bad pattern matches nothing", read, chainA, chainA, []Grant{grant("t_a", "t_a", allow("[", "*"))}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Evaluate(tc.req, tc.chain, tc.idChain, tc.grants); got != tc.want {
				t.Fatalf("Evaluate = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestMatchAny(t *testing.T) {
	for _, tc := range []struct {
		patterns []string
		s        string
		want     bool
	}{
		{[]string{"*"}, "compute:nodes:get", true},
		{[]string{"compute:nodes:*"}, "compute:nodes:get", true},
		{[]string{"compute:nodes:*"}, "compute:secrets:get", false},
		{[]string{"node/n*"}, "node/n1", true},
		{[]string{"node/*"}, "node/a/b", false},
		{[]string{"a", "b"}, "b", true},
		{nil, "x", false},
		{[]string{"["}, "[", true}, // a bad pattern still matches itself exactly
		{[]string{"["}, "x", false},
	} {
		if got := matchAny(tc.patterns, tc.s); got != tc.want {
			t.Errorf("matchAny(%q, %q) = %v, want %v", tc.patterns, tc.s, got, tc.want)
		}
	}
}

// FuzzEvaluate checks the decision's invariants on arbitrary patterns,
// actions and resources: a deny of everything added anywhere applicable
// beats any allow; an allow of everything is an allow unless a deny
// matches; an action outside the scopes and an empty chain are denies; a
// grant outside the chain changes nothing.
func FuzzEvaluate(f *testing.F) {
	f.Add("compute:nodes:get", "node/n1", "compute:nodes:*", "node/*", "compute:nodes:delete", "*", "")
	f.Add("compute:secrets:get", "secret/s", "*", "*", "compute:secrets:*", "secret/s", "compute:nodes:*")
	f.Add("a", "b", "[", "]", "a", "b", "a")
	f.Fuzz(func(t *testing.T, action, resource, allowAct, allowRes, denyAct, denyRes, scope string) {
		req := Request{Action: action, Resource: resource}
		if scope != "" {
			req.Scopes = []string{scope}
		}
		al := Statement{Effect: "allow", Actions: []string{allowAct}, Resources: []string{allowRes}}
		dn := Statement{Effect: "deny", Actions: []string{denyAct}, Resources: []string{denyRes}}
		g := []Grant{grant("t_a", "t_a", al, dn)}
		got := Evaluate(req, chainKid, chainA, g)
		inScope := scope == "" || matchAny([]string{scope}, action)
		denied := matchAny([]string{denyAct}, action) && matchAny([]string{denyRes}, resource)
		allowed := matchAny([]string{allowAct}, action) && matchAny([]string{allowRes}, resource)
		if want := inScope && allowed && !denied; got != want {
			t.Fatalf("Evaluate = %v, want %v", got, want)
		}
		withDeny := append(append([]Grant{}, g...), grant(RootTenant, RootTenant, deny("*", "*")))
		if Evaluate(req, chainKid, chainRoot, withDeny) {
			t.Fatal("a deny of everything in root did not beat the allow")
		}
		withAllow := []Grant{grant("t_a", "t_a", allow("*", "*"), dn)}
		if want := inScope && !denied; Evaluate(req, chainKid, chainA, withAllow) != want {
			t.Fatalf("allow of everything: got %v, want %v", !want, want)
		}
		if Evaluate(req, nil, chainA, withAllow) {
			t.Fatal("an empty chain allowed")
		}
		outside := append(append([]Grant{}, g...), grant("t_b", "t_b", allow("*", "*"), deny("*", "*")))
		if Evaluate(req, chainKid, chainA, outside) != got {
			t.Fatal("a grant outside the chain changed the decision")
		}
	})
}

func TestGrantApplies(t *testing.T) {
	in := tenantSet(chainKid)
	for _, tc := range []struct {
		tenant, idTenant string
		idChain          []Tenant
		want             bool
	}{
		{"t_kid", "t_kid", chainKid, true},
		{"t_a", "t_kid", chainKid, true},
		{"t_a", "t_a", chainA, true},
		{"t_kid", "t_a", chainA, false},           // made below its identity's tenant
		{"t_kid", RootTenant, chainRoot, false},   // root's identity bound in a child
		{"t_b", "t_b", chainB, false},             // outside the chain
		{RootTenant, RootTenant, chainRoot, true}, // root's own binding
	} {
		if got := grantApplies(tc.tenant, tc.idTenant, in, tenantSet(tc.idChain)); got != tc.want {
			t.Errorf("grantApplies(%s, %s) = %v, want %v", tc.tenant, tc.idTenant, got, tc.want)
		}
	}
}
