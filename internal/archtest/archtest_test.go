package archtest

import (
	"strings"
	"testing"
)

// TestRepositoryKeepsItsShape is the architecture test: it fails, naming
// file and line, when a module imports a transport, when a module's SQL
// names a table another module owns, when "root" is spelled outside iam,
// or when a production function is over 80 lines.
func TestRepositoryKeepsItsShape(t *testing.T) {
	vs, err := Check("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vs {
		t.Error(v)
	}
}

// TestCheckFindsPlantedViolations runs Check over a small tree with one
// violation of each kind, and one excused "root", and expects exactly those.
func TestCheckFindsPlantedViolations(t *testing.T) {
	vs, err := Check("testdata/planted")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, v := range vs {
		got = append(got, v.String())
	}
	want := []string{
		"internal/alpha/alpha.go:7: transport-import: internal/alpha imports the transport internal/api",
		"internal/alpha/alpha.go:12: foreign-table: internal/alpha names table beta_rows, owned by internal/beta",
		`internal/alpha/alpha.go:14: root-literal: "root" outside iam: use iam.RootTenant or iam.Scope`,
		"internal/beta/beta.go:4: long-function: long is 81 lines (at most 80): split it along read, decide, write",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("violations:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestOwnersComeFromCreateTable(t *testing.T) {
	owners, err := Owners("../..")
	if err != nil {
		t.Fatal(err)
	}
	for table, module := range map[string]string{
		"commands": "internal/commands", "nodes": "internal/nodes", "tenants": "internal/iam",
		"api_keys": "internal/apikeys", "idempotency": "internal/idempotency", "audit_events": "internal/audit",
	} {
		if owners[table] != module {
			t.Errorf("owner of %s = %q, want %q", table, owners[table], module)
		}
	}
}
