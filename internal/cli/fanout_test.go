package cli_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// commands fanout --wait shows progress on standard error (plain lines
// off a terminal) and ends with a summary by state, exit 0 when every
// command succeeded; commands list --fanout lists that fan-out's commands;
// commands list --state bogus is refused INVALID_INPUT (exit 1), not an
// empty table.
func TestFanoutWaitSummaryAndList(t *testing.T) {
	db := storetest.NewTestSQLite(t)
	e := testenv.Start(t, db, testenv.Options{Nodes: 2})
	t.Setenv("BC_ADDR", "http://"+e.CP.APIAddr)
	t.Setenv("BC_API_KEY", e.AdminKey)
	n0, n1 := e.Nodes[0].NodeID(), e.Nodes[1].NodeID()

	code, out, errOut := run(t, "commands", "fanout", "--node", n0, "--node", n1, "--kind", "diag.run", "--wait")
	if code != 0 {
		t.Fatalf("fanout --wait: exit %d: %s%s", code, out, errOut)
	}
	fields := strings.Fields(out)
	if len(fields) < 2 || fields[0] != "fan-out" || !strings.HasPrefix(fields[1], "fo") {
		t.Fatalf("fanout --wait printed %q", out)
	}
	fanoutID := strings.TrimSuffix(fields[1], ":")
	if want := "fan-out " + fanoutID + ": 2 commands: 2 succeeded\n"; out != want {
		t.Fatalf("summary %q, want %q", out, want)
	}
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	if last := lines[len(lines)-1]; last != "fan-out "+fanoutID+": 2/2 final (2 succeeded)" || strings.Contains(errOut, "\r") {
		t.Fatalf("progress off a terminal: %q", errOut)
	}

	code, out, errOut = run(t, "commands", "list", "--fanout", fanoutID, "--json")
	var list struct {
		Commands []struct {
			NodeID   string `json:"node_id"`
			FanoutID string `json:"fanout_id"`
		} `json:"commands"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list.Commands) != 2 || list.Commands[0].FanoutID != fanoutID {
		t.Fatalf("commands list --fanout: exit %d %s%s", code, out, errOut)
	}
	if code, out, _ = run(t, "commands", "list", "--fanout", "fonone"); code != 0 || strings.Count(out, "\n") != 1 {
		t.Fatalf("commands list --fanout of no fan-out: exit %d %q", code, out)
	}
	code, out, errOut = run(t, "commands", "list", "--state", "bogus")
	if code != 1 || !strings.Contains(errOut, "INVALID_INPUT") || out != "" {
		t.Fatalf("commands list --state bogus: exit %d, out %q, err %q; want 1 and INVALID_INPUT", code, out, errOut)
	}

	// A node that never connects keeps its command queued: --wait gives
	// up at its timeout with the summary so far, exit 1.
	if _, err := db.ExecContext(context.Background(), `INSERT INTO nodes (id, tenant_id, name, role, created_at) VALUES ('n-offline', 'root', 'n-offline', 'node', 0)`); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = run(t, "commands", "fanout", "--node", "n-offline", "--kind", "node.ping", "--wait", "--timeout", "1s")
	if code != 1 || !strings.HasSuffix(out, ": 1 command: 1 queued\n") || !strings.Contains(errOut, "unfinished") {
		t.Fatalf("fanout --wait with an offline node: exit %d, out %q, err %q", code, out, errOut)
	}
}
