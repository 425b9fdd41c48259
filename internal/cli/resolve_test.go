package cli_test

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// The CLI takes a node's name, a tenant's name, a secret's name and a
// unique id prefix where it takes an id; an ambiguous prefix is refused
// (exit 2) listing the candidates; another tenant's objects are never
// candidates.
func TestNamesAndPrefixes(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	ctx := context.Background()
	n1 := e.Join(t, pki.RoleNode, "gpu-01")
	e.Join(t, pki.RoleNode, "gpu-02")
	t.Setenv("BC_ADDR", "http://"+e.CP.APIAddr)
	t.Setenv("BC_API_KEY", e.AdminKey)

	// A node by name.
	code, out, errOut := run(t, "commands", "run", "--node", "gpu-01", "--kind", "node.ping", "--json")
	if code != 0 || !strings.Contains(out, n1.NodeID()) {
		t.Fatalf("commands run --node gpu-01: exit %d: %s%s", code, out, errOut)
	}
	code, out2, errOut := run(t, "commands", "run", "--node", n1.NodeID()[:6], "--kind", "node.ping", "--json")
	if code != 0 || !strings.Contains(out2, n1.NodeID()) {
		t.Fatalf("commands run --node PREFIX: exit %d: %s%s", code, out2, errOut)
	}
	c1, c2 := idIn(t, out), idIn(t, out2)
	if code, out, errOut := run(t, "nodes", "show", "gpu-01", "--json"); code != 0 || !strings.Contains(out, n1.NodeID()) {
		t.Fatalf("nodes show gpu-01: exit %d: %s%s", code, out, errOut)
	}

	// A command by a unique prefix of its id.
	p := uniquePrefix(c1, c2)
	if code, out, errOut := run(t, "commands", "show", p, "--json"); code != 0 || !strings.Contains(out, c1) {
		t.Fatalf("commands show %s: exit %d: %s%s", p, code, out, errOut)
	}
	// An ambiguous prefix: refused, exit 2, with the candidates.
	code, out, errOut = run(t, "commands", "show", "c")
	ids := []string{c1, c2}
	sort.Strings(ids)
	if want := "error: \"c\" matches 2 commands; give one of their ids (or a longer prefix):\n  " + ids[0] + "\n  " + ids[1] + "\n"; code != 2 || out != "" || errOut != want {
		t.Fatalf("ambiguous prefix: exit %d, stderr %q, want %q", code, errOut, want)
	}

	// A tenant by name.
	tn, err := e.Client.CreateTenant(ctx, "", "acme")
	if err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := run(t, "tenants", "suspend", "acme"); code != 0 || out != tn.ID+" suspended\n" {
		t.Fatalf("tenants suspend acme: exit %d: %q %s", code, out, errOut)
	}

	// A secret by name within the caller's tenant.
	vf := filepath.Join(t.TempDir(), "v")
	if err := os.WriteFile(vf, []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := run(t, "secrets", "put", "--name", "db-pass", "--value-file", vf); code != 0 {
		t.Fatalf("secrets put: exit %d: %s", code, errOut)
	}
	if code, out, errOut := run(t, "secrets", "show", "db-pass"); code != 0 || !strings.HasPrefix(out, "ref      secret://root/db-pass\n") {
		t.Fatalf("secrets show db-pass: exit %d: %q %s", code, out, errOut)
	}

	// Another tenant's admin: root's commands and nodes are no candidates,
	// and the name or prefix goes to the API as it is, answered as before.
	_, other := e.TenantAdmin(t, "other")
	t.Setenv("BC_API_KEY", other.Key())
	for _, args := range [][]string{{"commands", "show", "c"}, {"commands", "run", "--node", "gpu-01", "--kind", "node.ping"}} {
		code, out, errOut := run(t, args...)
		if code != 1 || !strings.HasPrefix(errOut, "error: ACCESS_DENIED: ") || strings.Contains(out+errOut, c1) || strings.Contains(out+errOut, n1.NodeID()) {
			t.Fatalf("%v as another tenant: exit %d: %s%s", args, code, out, errOut)
		}
	}
}

// idIn returns the "id" of a JSON answer.
func idIn(t *testing.T, js string) string {
	t.Helper()
	_, rest, ok := strings.Cut(js, `"id": "`)
	if !ok {
		t.Fatalf("no id in %s", js)
	}
	id, _, _ := strings.Cut(rest, `"`)
	return id
}

// uniquePrefix is the shortest prefix of a that b does not share.
func uniquePrefix(a, b string) string {
	for i := 1; i <= len(a); i++ {
		if !strings.HasPrefix(b, a[:i]) {
			return a[:i]
		}
	}
	return a
}
