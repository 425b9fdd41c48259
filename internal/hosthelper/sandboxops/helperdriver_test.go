package sandboxops_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/daemon/sandbox"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// TestHelperDriverRouting: on the node side, only the sandbox kinds go to
// the helper, each with the signed command from the context; every other
// kind runs on the wrapped driver without a helper call; a sandbox kind
// without a signed command fails signed-command-missing before any call;
// an interactive exec answers exec-unsupported.
func TestHelperDriverRouting(t *testing.T) {
	f := newSimFixture(t)
	client := &inProcess{ops: f.ops}
	node := &sandbox.HelperDriver{Driver: driver.NewSim("n1"), Client: client}
	ctx := context.Background()
	if _, err := node.Run(ctx, kinds.NodePing, []byte("{}")); err != nil || client.calls != 0 {
		t.Fatalf("node.ping: %v, %d helper calls", err, client.calls)
	}
	c := createPayload(f.digest, spec.RuntimeSim, f.now.Add(time.Hour))
	p, _ := json.Marshal(c)
	if _, err := node.Run(ctx, kinds.SandboxCreate, p); !errors.Is(err, sandbox.ErrNoSignedCommand) || client.calls != 0 {
		t.Fatalf("create without a signed command: %v, %d helper calls", err, client.calls)
	}
	cmd := f.s.command(t, f.now, "n1", kinds.SandboxCreate, c, nil)
	if _, err := node.Run(driver.WithCommand(ctx, cmd), kinds.SandboxCreate, p); err != nil || client.calls != 1 {
		t.Fatalf("create: %v, %d helper calls", err, client.calls)
	}
	if got := f.host.Sandboxes(); len(got) != 1 || got[0] != c.SandboxID {
		t.Fatalf("sandboxes %v", got)
	}
	// The same signed command again: the helper's own replay store
	// refuses it, whatever the node does.
	if _, err := node.Run(driver.WithCommand(ctx, cmd), kinds.SandboxCreate, p); err == nil || err.Error() != "sandbox: helper: helper refused: command-refused: replayed" {
		t.Fatalf("replayed create: %v", err)
	}
	if _, err := node.OpenShell(ctx, c.SandboxID, []string{"sh"}); !errors.Is(err, driver.ErrShellUnsupported) {
		t.Fatalf("OpenShell: %v", err)
	}
}
