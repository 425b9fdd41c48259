package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// TestBatchCreatePrintsItsID: `batch create` prints the new batch's id
// alone (so B=$(better-compute batch create …) works as the README shows),
// and --json the whole batch.
func TestBatchCreatePrintsItsID(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Nodes: 1})
	t.Setenv("BC_ADDR", e.Client.BaseURL)
	t.Setenv("BC_API_KEY", e.AdminKey)
	t.Setenv("BC_API_KEY_FILE", "")
	run := func(args ...string) string { t.Helper(); return runOK(t, args...) }
	id := strings.TrimSpace(run("batch", "create", "--kind", "disk.wipe", "--node", e.Nodes[0].NodeID()))
	if !strings.HasPrefix(id, "b") || strings.ContainsAny(id, " \n\t") {
		t.Fatalf("batch create printed %q, want the id alone", id)
	}
	if shown := run("batch", "show", id, "--json"); !strings.Contains(shown, `"id": "`+id+`"`) {
		t.Fatalf("batch show %s --json: %s", id, shown)
	}
	// A node's name works too.
	n, err := e.Client.Node(context.Background(), e.Nodes[0].NodeID())
	if err != nil {
		t.Fatal(err)
	}
	if byName := strings.TrimSpace(run("batch", "create", "--kind", "disk.wipe", "--node", n.Name)); !strings.HasPrefix(byName, "b") {
		t.Fatalf("batch create by name printed %q", byName)
	}
	if js := run("batch", "create", "--kind", "disk.wipe", "--node", e.Nodes[0].NodeID(), "--json"); !strings.Contains(js, `"leaves"`) {
		t.Fatalf("batch create --json: %s", js)
	}
}

// TestCommandsRunPrintsItsID: `commands run` without --wait prints the
// queued command's id alone (C=$(… commands run …) works), and with --json
// the whole command.
func TestCommandsRunPrintsItsID(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Nodes: 1})
	t.Setenv("BC_ADDR", e.Client.BaseURL)
	t.Setenv("BC_API_KEY", e.AdminKey)
	t.Setenv("BC_API_KEY_FILE", "")
	run := func(args ...string) string { t.Helper(); return runOK(t, args...) }
	id := strings.TrimSpace(run("commands", "run", "--node", e.Nodes[0].NodeID(), "--kind", "node.ping"))
	if !strings.HasPrefix(id, "c") || strings.ContainsAny(id, " \n\t") {
		t.Fatalf("commands run printed %q, want the id alone", id)
	}
	if js := run("commands", "run", "--node", e.Nodes[0].NodeID(), "--kind", "node.ping", "--json"); !strings.Contains(js, `"state"`) {
		t.Fatalf("commands run --json: %s", js)
	}
}

// runOK runs the CLI in process with args and returns its standard output,
// failing the test when it does not succeed.
func runOK(t *testing.T, args ...string) string {
	t.Helper()
	root := NewRoot()
	var out, errb bytes.Buffer
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&errb)
	if err := root.Execute(); err != nil {
		t.Fatalf("%v: %v %s", args, err, errb.String())
	}
	return out.String()
}
