package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/bastions/opstest"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/server"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// TestBastionsOpAndTerminalCommands: bastions op prints the result; an
// approval request says on standard error what to run on the machine,
// with the summary, and exits ExitApprovalRequired; with --approval it
// runs. bastions terminal prints a fresh session id, asks for approval
// the same way, and with --session and --approval carries standard input
// to the terminal and its output back. Usage errors exit 2 before any
// request.
func TestBastionsOpAndTerminalCommands(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Tune: func(o *server.Options) {
		o.Roles = []string{server.RoleAPI, server.RoleGateway, server.RoleWorkers, server.RoleLanes}
		o.LanesListen = "127.0.0.1:0"
	}})
	e.CP.Bastions.SetOpsDialer(opstest.Start(t))
	t.Setenv("BC_ADDR", "http://"+e.CP.APIAddr)
	t.Setenv("BC_API_KEY", e.AdminKey)
	t.Setenv("BC_API_KEY_FILE", "")
	id := "nclibastionxxxxx"
	if _, err := e.CP.DB.ExecContext(context.Background(), `INSERT INTO nodes (id, tenant_id, name, role, created_at) VALUES ($1, $2, 'desk', 'bastion', 0)`, id, iam.RootTenant); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runIn(t, false, "", "bastions", "op", "--bastion", id, "--kind", "observe:disk")
	var res map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &res) != nil || res["filesystems"] == nil {
		t.Fatalf("op observe:disk: exit %d: %s%s", code, out, errOut)
	}
	move := []string{"bastions", "op", "--bastion", id, "--kind", "files:move-plan", "--args", `{"share":"sh_x","moves":[{"from":"a","to":""}]}`}
	code, out, errOut = runIn(t, false, "", move...)
	if code != ExitApprovalRequired || out != "" || !strings.Contains(errOut, "approval required: on the bastion's machine run: bcd bastion approve "+opstest.Approval+"\n") ||
		!strings.Contains(errOut, "move a to b") {
		t.Fatalf("op needing approval: exit %d: %q %q", code, out, errOut)
	}
	if code, out, errOut := runIn(t, false, "", append(move, "--json")...); code != ExitApprovalRequired || !strings.Contains(out, `"status": "approval-required"`) {
		t.Fatalf("op needing approval --json: exit %d: %q %q", code, out, errOut)
	}
	if code, out, errOut := runIn(t, false, "", append(move, "--approval", opstest.Approval)...); code != 0 || !strings.Contains(out, "moved") {
		t.Fatalf("approved op: exit %d: %q %q", code, out, errOut)
	}
	if code, _, errOut := runIn(t, false, "", "bastions", "op", "--bastion", id, "--kind", "observe:procs"); code != 1 || !strings.Contains(errOut, "the bastion refused the op (excluded)") {
		t.Fatalf("refused op: exit %d: %q", code, errOut)
	}
	for _, args := range [][]string{{"--kind", "observe:disk"}, {"--bastion", id}, {"--bastion", id, "--kind", "observe:disk", "--args", "[1]"}} {
		if code, _, _ := runIn(t, false, "", append([]string{"bastions", "op"}, args...)...); code != 2 {
			t.Fatalf("op %v: exit %d, want 2", args, code)
		}
	}
	code, _, errOut = runIn(t, false, "", "bastions", "terminal", "--bastion", id)
	session := strings.TrimPrefix(strings.SplitN(errOut, "\n", 2)[0], "session ")
	if code != ExitApprovalRequired || len(session) != 23 || !strings.Contains(errOut, "--session "+session+" --approval "+opstest.Approval) {
		t.Fatalf("terminal without approval: exit %d: %q", code, errOut)
	}
	if code, _, _ := runIn(t, false, "", "bastions", "terminal", "--bastion", id, "--approval", opstest.Approval); code != 2 {
		t.Fatalf("--approval without --session: exit %d, want 2", code)
	}
	code, out, errOut = runIn(t, false, "echo hi\nexit\n", "bastions", "terminal", "--bastion", id, "--session", session, "--approval", opstest.Approval)
	if code != 0 || out != opstest.Prompt+"echo hi\n" {
		t.Fatalf("terminal: exit %d: %q %q", code, out, errOut)
	}
}
