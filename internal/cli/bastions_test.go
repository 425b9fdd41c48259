package cli_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// TestBastionsCommands: pair-token writes the token only to a new 0600
// file (never to standard output); list --json is {"bastions": [{id, name,
// connected, families}]} with the effective families (deny beats allow);
// grant, grants, revoke-grant and unpair work end to end over the API.
func TestBastionsCommands(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	t.Setenv("BC_ADDR", "http://"+e.CP.APIAddr)
	t.Setenv("BC_API_KEY", e.AdminKey)
	t.Setenv("BC_API_KEY_FILE", "")
	file := filepath.Join(t.TempDir(), "pair.token")
	code, out, errOut := run(t, "bastions", "pair-token", "--name", "laptop", "--out", file)
	tok, err := os.ReadFile(file)
	if code != 0 || err != nil || len(strings.TrimSpace(string(tok))) < 20 {
		t.Fatalf("pair-token: exit %d: %s%s (%v)", code, out, errOut, err)
	}
	if fi, _ := os.Stat(file); fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file mode %v", fi.Mode().Perm())
	}
	if strings.Contains(out+errOut, strings.TrimSpace(string(tok))) {
		t.Fatal("the pairing token was printed")
	}
	if code, _, _ := run(t, "bastions", "pair-token", "--name", "laptop", "--out", file); code != 1 {
		t.Fatalf("an existing --out file: exit %d, want 1", code)
	}
	if code, _, _ := run(t, "bastions", "pair-token", "--name", "laptop"); code != 2 {
		t.Fatalf("no --out: exit %d, want 2", code)
	}
	id := "nclibastionxxxxx"
	if _, err := e.CP.DB.ExecContext(context.Background(), `INSERT INTO nodes (id, tenant_id, name, role, created_at) VALUES ($1, $2, 'desk', 'bastion', 0)`, id, iam.RootTenant); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := run(t, "bastions", "grant", "--bastion", id, "--allow", "inference", "--allow", "models", "--model", "llama3:8b"); code != 0 {
		t.Fatalf("grant: exit %d: %s%s", code, out, errOut)
	}
	code, out, errOut = run(t, "bastions", "grant", "--bastion", id, "--allow", "egress", "--deny", "models", "--json")
	var g struct{ ID string }
	if code != 0 || json.Unmarshal([]byte(out), &g) != nil || g.ID == "" {
		t.Fatalf("grant --json: exit %d: %s%s", code, out, errOut)
	}
	if code, _, errOut := run(t, "bastions", "grant", "--bastion", id, "--allow", "shell"); code == 0 || !strings.Contains(errOut, `unknown family \"shell\"`) && !strings.Contains(errOut, `unknown family "shell"`) {
		t.Fatalf("unknown family: exit %d: %s", code, errOut)
	}
	wantList(t, id, []string{"egress", "inference"})
	if code, out, errOut := run(t, "bastions", "revoke-grant", g.ID); code != 0 {
		t.Fatalf("revoke-grant: exit %d: %s%s", code, out, errOut)
	}
	wantList(t, id, []string{"inference", "models"})
	code, out, _ = run(t, "bastions", "grants", "--bastion", id, "--json")
	var gs struct{ Grants []map[string]any }
	if code != 0 || json.Unmarshal([]byte(out), &gs) != nil || len(gs.Grants) != 2 {
		t.Fatalf("grants --json: %s", out)
	}
	if code, out, errOut := run(t, "bastions", "unpair", id, "--yes"); code != 0 || out != "unpaired\n" {
		t.Fatalf("unpair: exit %d: %s%s", code, out, errOut)
	}
	code, out, _ = run(t, "bastions", "show", id, "--json")
	var b map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &b) != nil || b["state"] != "unpaired" {
		t.Fatalf("show after unpair: %s", out)
	}
}

// wantList checks bastions list --json: one bastion, exactly the keys id,
// name, connected and families, with families fams.
func wantList(t *testing.T, id string, fams []string) {
	t.Helper()
	code, out, errOut := run(t, "bastions", "list", "--json")
	var l struct{ Bastions []map[string]any }
	if code != 0 || json.Unmarshal([]byte(out), &l) != nil || len(l.Bastions) != 1 {
		t.Fatalf("list --json: exit %d: %s%s", code, out, errOut)
	}
	r := l.Bastions[0]
	keys := make([]string, 0, len(r))
	for k := range r {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if !slices.Equal(keys, []string{"connected", "families", "id", "name"}) || r["id"] != id || r["name"] != "desk" || r["connected"] != false {
		t.Fatalf("list row %v", r)
	}
	var got []string
	for _, f := range r["families"].([]any) {
		got = append(got, f.(string))
	}
	if !slices.Equal(got, fams) {
		t.Fatalf("families %v, want %v", got, fams)
	}
}
