package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/iam"
)

// exampleStatements reads the first JSON block after heading in docs/iam.md.
func exampleStatements(t *testing.T, heading string) []iam.Statement {
	t.Helper()
	doc, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(doc), heading)
	if !ok {
		t.Fatalf("docs/iam.md has no %q", heading)
	}
	_, block, _ := strings.Cut(after, "```json\n")
	block, _, _ = strings.Cut(block, "```")
	var st []iam.Statement
	if err := json.Unmarshal([]byte(block), &st); err != nil {
		t.Fatalf("%s: %v", heading, err)
	}
	return st
}

// TestAuditorExampleIsReadOnly decides every action of the method table
// with the documented auditor role: every state-changing action is denied,
// every read but secrets.get allowed.
func TestAuditorExampleIsReadOnly(t *testing.T) {
	st := exampleStatements(t, "### A read-only auditor")
	chain := []iam.Tenant{{ID: "t1", ParentID: "root"}, {ID: "root"}}
	grants := []iam.Grant{{Tenant: "t1", IdentityTenant: "t1", Statements: st}}
	for _, m := range allMethods() {
		got := iam.Evaluate(iam.Request{Action: m.Action, Resource: "tenant/t1"}, chain, chain, grants)
		want := !m.Mutates && m.Action != "compute:secrets:get"
		if got != want {
			t.Errorf("%s (%s): allowed %v, want %v", m.Name, m.Action, got, want)
		}
	}
	for _, f := range furtherActions {
		if iam.Evaluate(iam.Request{Action: f.action, Resource: "identity/i1"}, chain, chain, grants) {
			t.Errorf("%s allowed", f.action)
		}
	}
}

// TestDiagExampleIsNarrow: the documented diag role creates commands on
// the nodes it names only, and changes nothing else.
func TestDiagExampleIsNarrow(t *testing.T) {
	st := exampleStatements(t, "### Run diagnostics on some nodes only")
	chain := []iam.Tenant{{ID: "t1", ParentID: "root"}, {ID: "root"}}
	grants := []iam.Grant{{Tenant: "t1", IdentityTenant: "t1", Statements: st}}
	allow := func(action, resource string) bool {
		return iam.Evaluate(iam.Request{Action: action, Resource: resource}, chain, chain, grants)
	}
	if !allow("compute:commands:create", "node/n4kq2…") || allow("compute:commands:create", "node/other") {
		t.Error("commands:create is not limited to the named nodes")
	}
	if allow("compute:commands:create", "tenant/t1") {
		t.Error("a fan-out (decided on the tenant) is allowed")
	}
	for _, m := range allMethods() {
		if m.Mutates && m.Action != "compute:commands:create" && allow(m.Action, "node/n4kq2…") {
			t.Errorf("%s allowed", m.Action)
		}
	}
}
