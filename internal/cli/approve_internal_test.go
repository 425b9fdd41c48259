package cli

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// TestBatchApproveAsks: batch approve shows what it signs (batch id, root,
// each leaf's node and kind) and signs only when confirmed on a terminal
// or given --yes; with no terminal and no --yes it refuses, exit 2, and
// signs nothing; a "no" on the terminal signs nothing, exit 1.
func TestBatchApproveAsks(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Nodes: 1})
	t.Setenv("BC_ADDR", e.Client.BaseURL)
	t.Setenv("BC_API_KEY", e.AdminKey)
	t.Setenv("BC_API_KEY_FILE", "")
	ctx := context.Background()
	node := e.Nodes[0].NodeID()
	b, err := e.Client.CreateBatch(ctx, []client.LeafRequest{{NodeID: node, Kind: "disk.wipe"}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	terminal := false
	old := stdinIsTerminal
	stdinIsTerminal = func() bool { return terminal }
	defer func() { stdinIsTerminal = old }()
	approve := func(in string, args ...string) (int, string) {
		root := NewRoot()
		var out, errb bytes.Buffer
		root.SetArgs(append([]string{"batch", "approve", b.ID}, args...))
		root.SetIn(strings.NewReader(in))
		root.SetOut(&out)
		root.SetErr(&errb)
		err := root.Execute()
		var ee *ExitError
		switch {
		case err == nil:
			return 0, errb.String()
		case errors.As(err, &ee):
			return ee.Code, errb.String() + err.Error()
		}
		return 1, errb.String() + err.Error()
	}
	approvals := func() int {
		got, err := e.Client.Batch(ctx, b.ID)
		if err != nil {
			t.Fatal(err)
		}
		return len(got.Approvals)
	}
	key := func(i int) string { return filepath.Join(e.ApproverDir, "approver-"+string(rune('0'+i))+".key") }

	if code, out := approve("y\n", "--key", key(1)); code != 2 || !strings.Contains(out, "--yes") || approvals() != 0 {
		t.Fatalf("no terminal, no --yes: exit %d, %d approvals:\n%s", code, approvals(), out)
	}
	terminal = true
	code, out := approve("n\n", "--key", key(1))
	if code != 1 || approvals() != 0 {
		t.Fatalf("answered no: exit %d, %d approvals:\n%s", code, approvals(), out)
	}
	for _, want := range []string{b.ID, b.Root, node, "disk.wipe", "[y/N]"} {
		if !strings.Contains(out, want) {
			t.Errorf("the question does not show %q:\n%s", want, out)
		}
	}
	if code, out := approve("y\n", "--key", key(1)); code != 0 || approvals() != 1 {
		t.Fatalf("answered yes: exit %d, %d approvals:\n%s", code, approvals(), out)
	}
	terminal = false
	if code, out := approve("", "--key", key(2), "--yes"); code != 0 || approvals() != 2 {
		t.Fatalf("--yes: exit %d, %d approvals:\n%s", code, approvals(), out)
	}
}
