package cli_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// nodes list shows when each node last said Hello and the bcd version it
// sent, in the table and exactly in --json.
func TestNodesListShowsLastSeenAndVersion(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Nodes: 1})
	t.Setenv("BC_ADDR", "http://"+e.CP.APIAddr)
	t.Setenv("BC_API_KEY", e.AdminKey)
	code, out, errOut := run(t, "nodes", "list", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var list struct {
		Nodes []map[string]any `json:"nodes"`
	}
	err := json.Unmarshal([]byte(out), &list)
	ns := list.Nodes
	if err != nil || len(ns) != 1 {
		t.Fatalf("nodes list --json: %v %q", err, out)
	}
	n := ns[0]
	if n["id"] != e.Nodes[0].NodeID() || n["version"] != daemon.Version {
		t.Fatalf("node: %v, want version %q", n, daemon.Version)
	}
	seen, ok := n["last_seen_at"].(string)
	if !ok {
		t.Fatalf("no last_seen_at: %v", n)
	}
	at, err := time.Parse(time.RFC3339Nano, seen)
	if err != nil || at.IsZero() {
		t.Fatalf("last_seen_at %q: %v", seen, err)
	}
	code, out, errOut = run(t, "nodes", "list")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "LAST SEEN") || !strings.Contains(lines[0], "VERSION") {
		t.Fatalf("table:\n%s", out)
	}
	want := at.UTC().Format("2006-01-02T15:04:05.000Z")
	if f := strings.Fields(lines[1]); f[len(f)-2] != want || f[len(f)-1] != daemon.Version {
		t.Fatalf("row %q: want last seen %s and version %s", lines[1], want, daemon.Version)
	}
}
