package integration

import (
	"context"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// TestSandboxLongExecDoesNotDelayOthers runs, through the control plane
// and a real runtime (runc where installed), a 20 s exec in sandbox A and,
// once the node reports it running, creates sandbox B and runs an exec in
// it: both succeed while A's exec has not returned (bcd runs each
// sandbox's commands in its own lane), and A's exec then finishes too.
func TestSandboxLongExecDoesNotDelayOthers(t *testing.T) {
	s := startSandboxes(t, storetest.NewTestSQLite(t), nil, 0)
	ctx := context.Background()
	a, err := s.admin.CreateSandbox(ctx, "", "small")
	if err != nil {
		t.Fatalf("create A: %v", err)
	}
	type outcome struct {
		r   client.ExecResult
		err error
	}
	aDone := make(chan outcome, 1)
	go func() {
		r, err := s.admin.Exec(ctx, a.ID, []string{"sh", "-c", "sleep 20"}, 30)
		aDone <- outcome{r, err}
	}()
	waitRunningExec(t, s, s.Nodes[0].NodeID())

	b, err := s.admin.CreateSandbox(ctx, "", "small")
	if err != nil {
		t.Fatalf("create B while A's exec runs: %v", err)
	}
	if b.NodeID != a.NodeID {
		t.Fatalf("B on %s, A on %s: want one host", b.NodeID, a.NodeID)
	}
	r, err := s.admin.Exec(ctx, b.ID, []string{"echo", "hi"}, 10)
	if err != nil || string(r.Stdout) != "hi\n" || r.ExitCode != 0 {
		t.Fatalf("exec in B while A's exec runs: %+v %v", r, err)
	}
	select {
	case o := <-aDone:
		t.Fatalf("A's exec returned (%+v, %v) before B's create and exec finished: they did not run beside it", o.r, o.err)
	default:
	}
	select {
	case o := <-aDone:
		if o.err != nil || o.r.ExitCode != 0 {
			t.Fatalf("A's exec: %+v %v", o.r, o.err)
		}
	case <-time.After(testenv.WaitTimeout):
		t.Fatalf("A's exec did not return within %v", testenv.WaitTimeout)
	}
}

// waitRunningExec waits until the node reports a sandbox.exec running
// (its "running" update comes once the driver has run it for
// daemon.Config.RunningAfter), so the exec holds its sandbox's lane.
func waitRunningExec(t *testing.T, s sandboxEnv, nodeID string) {
	t.Helper()
	poke, stop := s.CP.Bus.Subscribe(bus.NodeTopic(nodeID))
	defer stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	timeout := time.After(testenv.WaitTimeout)
	for {
		cs, err := s.CP.Commands.List(context.Background(), iam.RootScope(), commands.Filter{NodeID: nodeID, State: string(wire.StateRunning)})
		if err != nil {
			t.Fatalf("list commands: %v", err)
		}
		for _, c := range cs {
			if c.Kind == kinds.SandboxExec {
				return
			}
		}
		select {
		case <-poke:
		case <-tick.C:
		case <-timeout:
			t.Fatalf("no sandbox.exec running on %s after %v", nodeID, testenv.WaitTimeout)
		}
	}
}
