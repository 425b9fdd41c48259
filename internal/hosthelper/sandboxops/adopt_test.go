package sandboxops_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/daemon/sandbox"
	"github.com/bettercompute/bettercompute/internal/daemon/sshaccess"
	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// Every sandbox driver the node can have adopts (a change of the
// interface must not silently leave one out).
var (
	_ daemon.SandboxAdopter = (*sandbox.Driver)(nil)
	_ daemon.SandboxAdopter = (*sandbox.HelperDriver)(nil)
	_ daemon.SandboxAdopter = (*sshaccess.Driver)(nil)
)

// TestHelperAdoptsUnderItsOwnTrust: on an unprivileged node the root
// helper's host adopts: asked with no desired state to send, the node's
// driver does not call the helper; then the helper verifies each running
// sandbox's kept signed commands under its own trust, keeps the one that
// matches and answers it (again on a later call, as to a restarted
// node), and kills the one whose state file was changed, which the
// node's failure poll then reports spec-unmatched.
func TestHelperAdoptsUnderItsOwnTrust(t *testing.T) {
	f := newSimFixture(t)
	ctx := context.Background()
	var ids []string
	for range 2 {
		cmd, c := f.create(t, nil)
		if _, err := f.ops.Create(ctx, req(helperwire.OpSandboxCreate, cmd)); err != nil {
			t.Fatalf("create: %v", err)
		}
		ids = append(ids, c.SandboxID)
	}
	kept, tampered := ids[0], ids[1]
	extend(t, filepath.Join(f.hostDir, "state", tampered+".json"))

	// The helper restarts on the same state directory and runtime.
	h2 := openHostIn(t, f.hostDir, func(string) sandbox.Runtime { return f.sim }, f.store, f.clk)
	ops2 := newOps(t, h2, t.TempDir(), f.clk, fixed(f.s.trust()))
	client := &inProcess{ops: ops2}
	node := &sandbox.HelperDriver{Driver: driver.NewSim("n1"), Client: client}
	if _, err := node.AdoptSandboxes(ctx, nil); !errors.Is(err, sandbox.ErrNoIntentYet) || client.calls != 0 {
		t.Fatalf("adopt with no desired state: %v, %d helper calls", err, client.calls)
	}
	node.Intent = func() []byte { return []byte("signed desired state") } // the fixture's trust is fixed
	for range 2 {
		got, err := node.AdoptSandboxes(ctx, nil)
		if err != nil || !slices.Equal(got, []string{kept}) {
			t.Fatalf("adopted %v %v, want [%s]", got, err, kept)
		}
	}
	if _, held := h2.Get(tampered); held {
		t.Fatal("the tampered sandbox was adopted")
	}
	reported := map[string]string{}
	node.OnSandboxFailed(func(id, reason string) { reported[id] = reason })
	if err := node.PollFailures(ctx); err != nil || reported[tampered] != sandbox.ReasonSpecUnmatched || len(reported) != 1 {
		t.Fatalf("failures %v %v, want %s %s", reported, err, tampered, sandbox.ReasonSpecUnmatched)
	}
	ex, _ := json.Marshal(spec.Exec{SandboxID: kept, Argv: []string{"true"}, TimeoutMS: 1000})
	cmd := f.s.command(t, f.now, "n1", kinds.SandboxExec, json.RawMessage(ex), nil)
	if _, err := ops2.Exec(ctx, req(helperwire.OpSandboxExec, cmd)); err != nil {
		t.Fatalf("exec in the adopted sandbox: %v", err)
	}
}

// extend moves the deadline in a state file an hour later.
func extend(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var st map[string]any
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	st["deadline_ms"] = st["deadline_ms"].(float64) + float64(time.Hour.Milliseconds())
	if b, err = json.Marshal(st); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
