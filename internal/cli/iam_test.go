package cli_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// bindings list shows the bindings of a tenant and below, as a table and
// as JSON.
func TestBindingsList(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	tenant, _ := e.TenantAdmin(t, "cli-bind")
	t.Setenv("BC_ADDR", "http://"+e.CP.APIAddr)
	t.Setenv("BC_API_KEY", e.AdminKey)
	code, out, errOut := run(t, "bindings", "list", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var all struct {
		Bindings []struct {
			ID           string `json:"id"`
			TenantID     string `json:"tenant_id"`
			IdentityName string `json:"identity_name"`
			RoleID       string `json:"role_id"`
		} `json:"bindings"`
	}
	if err := json.Unmarshal([]byte(out), &all); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var sawRoot, sawTenant bool
	for _, b := range all.Bindings {
		sawRoot = sawRoot || b.ID == "admin" && b.TenantID == "root"
		sawTenant = sawTenant || b.TenantID == tenant && b.IdentityName == "cli-bind-admin" && b.RoleID == "admin"
	}
	if !sawRoot || !sawTenant {
		t.Fatalf("bindings list --json: %s", out)
	}
	code, out, errOut = run(t, "bindings", "list", "--tenant", tenant)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "id") || !strings.Contains(lines[1], "cli-bind-admin") {
		t.Fatalf("bindings list --tenant: %q", out)
	}
}

// sessions revoke ends a session; a second revoke is NOT_FOUND.
func TestSessionsRevoke(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	s, err := e.Client.CreateSession(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("BC_ADDR", "http://"+e.CP.APIAddr)
	t.Setenv("BC_API_KEY", e.AdminKey)
	if code, out, errOut := run(t, "sessions", "revoke", s.ID); code != 0 || out != "revoked\n" {
		t.Fatalf("exit %d: %q %s", code, out, errOut)
	}
	if code, _, errOut := run(t, "sessions", "revoke", s.ID); code == 0 || !strings.Contains(errOut, "NOT_FOUND") {
		t.Fatalf("second revoke: exit %d: %s", code, errOut)
	}
}
