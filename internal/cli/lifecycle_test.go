package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/clisafe"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// runIn runs the CLI with args and stdin, as Main does, with the terminal
// test answering terminal.
func runIn(t *testing.T, terminal bool, stdin string, args ...string) (int, string, string) {
	t.Helper()
	old := stdinIsTerminal
	stdinIsTerminal = func() bool { return terminal }
	defer func() { stdinIsTerminal = old }()
	var out, errb bytes.Buffer
	root := NewRoot()
	root.SetArgs(args)
	root.SetIn(strings.NewReader(stdin))
	root.SetOut(&clisafe.Writer{W: &out})
	root.SetErr(&clisafe.Writer{W: &errb})
	code := exitCode(root.Execute(), &errb)
	return code, out.String(), errb.String()
}

// exitCode is Main's mapping of an error to an exit status.
func exitCode(err error, stderr *bytes.Buffer) int {
	if err == nil {
		return 0
	}
	stderr.WriteString(err.Error())
	var ue *clisafe.UsageError
	var ee *ExitError
	switch {
	case errors.As(err, &ue):
		return 2
	case errors.As(err, &ee):
		return ee.Code
	}
	return 1
}

// tenants delete asks on a terminal and deletes only on a yes; without a terminal it refuses with exit 2 and names
// --yes; --yes deletes without asking.
func TestTenantsDeleteConfirms(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	ctx := context.Background()
	t.Setenv("BC_ADDR", "http://"+e.CP.APIAddr)
	t.Setenv("BC_API_KEY", e.AdminKey)
	tenant, _ := e.TenantAdmin(t, "cli-doomed")
	state := func() string {
		chain, err := e.CP.IAM.Chain(ctx, tenant)
		if err != nil || len(chain) == 0 {
			t.Fatalf("chain: %v", err)
		}
		return chain[0].State
	}

	code, _, errOut := runIn(t, false, "", "tenants", "delete", tenant)
	if code != 2 || !strings.Contains(errOut, "--yes") || state() != "active" {
		t.Fatalf("no terminal, no --yes: exit %d %q, state %s", code, errOut, state())
	}
	code, _, errOut = runIn(t, true, "no\n", "tenants", "delete", tenant)
	if code != 1 || !strings.Contains(errOut, "not confirmed") || state() != "active" {
		t.Fatalf("a wrong answer: exit %d %q, state %s", code, errOut, state())
	}
	code, out, errOut := runIn(t, true, "y\n", "tenants", "delete", tenant)
	if code != 0 || !strings.Contains(out, tenant+" deleted: 1 tenant(s)") || state() != "deleted" {
		t.Fatalf("confirmed: exit %d %q %q, state %s", code, out, errOut, state())
	}

	other, _ := e.TenantAdmin(t, "cli-scripted")
	code, out, errOut = runIn(t, false, "", "tenants", "delete", other, "--yes", "--json")
	var got struct {
		ID             string `json:"id"`
		TenantsDeleted int    `json:"tenants_deleted"`
		KeysRevoked    int    `json:"keys_revoked"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || got.ID != other || got.TenantsDeleted != 1 || got.KeysRevoked != 1 {
		t.Fatalf("--yes --json: exit %d %q %q", code, out, errOut)
	}
}

// The lifecycle reads answer --json, and their usage errors exit 2.
func TestLifecycleCommands(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Nodes: 1})
	t.Setenv("BC_ADDR", "http://"+e.CP.APIAddr)
	t.Setenv("BC_API_KEY", e.AdminKey)
	code, out, errOut := runIn(t, false, "", "whoami", "--json")
	if code != 0 || !strings.Contains(out, `"tenant_id": "root"`) {
		t.Fatalf("whoami: exit %d %q %q", code, out, errOut)
	}
	node := e.Nodes[0].NodeID()
	code, out, errOut = runIn(t, false, "", "nodes", "show", node, "--json")
	if code != 0 || !strings.Contains(out, node) {
		t.Fatalf("nodes show: exit %d %q %q", code, out, errOut)
	}
	code, out, errOut = runIn(t, false, "", "join-tokens", "create", "--json")
	var tok struct{ ID string }
	if code != 0 || json.Unmarshal([]byte(out), &tok) != nil {
		t.Fatalf("join-tokens create: exit %d %q %q", code, out, errOut)
	}
	if code, out, errOut = runIn(t, false, "", "join-tokens", "revoke", tok.ID); code != 0 || out != "revoked\n" {
		t.Fatalf("join-tokens revoke: exit %d %q %q", code, out, errOut)
	}
	code, out, errOut = runIn(t, false, "", "join-tokens", "list")
	if code != 0 || !strings.Contains(out, tok.ID) || !strings.Contains(out, "revoked") {
		t.Fatalf("join-tokens list: exit %d %q %q", code, out, errOut)
	}
	if code, _, errOut = runIn(t, false, "", "roles", "delete", "viewer"); code != 1 || !strings.Contains(errOut, "INVALID_STATE") {
		t.Fatalf("roles delete viewer: exit %d %q", code, errOut)
	}
	for _, args := range [][]string{{"whoami", "extra"}, {"nodes", "show"}, {"commands", "cancel"}, {"join-tokens", "revoke"}, {"tenants", "delete"}} {
		if code, _, _ := runIn(t, false, "", args...); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
}
