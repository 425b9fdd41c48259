package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

const (
	sandboxA = "sbxaaaaaaaaaaaaaaaa"
	sandboxB = "sbxbbbbbbbbbbbbbbbb"
)

// laneDriver is the sim driver with sandbox kinds of its own: each one
// reports its payload's tag on entered, and one for sandboxA then waits
// for release. It fails the test if two commands for one sandbox ever run
// at once.
type laneDriver struct {
	*driver.Sim
	t       *testing.T
	entered chan string
	release chan struct{}

	mu      sync.Mutex
	running map[string]string // sandbox id -> tag of the command running in it
}

func (d *laneDriver) Run(ctx context.Context, kind string, payload []byte) ([]byte, error) {
	if kind != kinds.SandboxExec {
		return d.Sim.Run(ctx, kind, payload)
	}
	var p struct {
		SandboxID string `json:"sandbox_id"`
		Tag       string `json:"tag"`
	}
	if err := json.Unmarshal(payload, &p); err != nil {
		return nil, err
	}
	d.mu.Lock()
	if other, ok := d.running[p.SandboxID]; ok {
		d.t.Errorf("%s runs in %s while %s still runs there", p.Tag, p.SandboxID, other)
	}
	d.running[p.SandboxID] = p.Tag
	d.mu.Unlock()
	d.entered <- p.Tag
	if p.SandboxID == sandboxA {
		<-d.release
	}
	d.mu.Lock()
	delete(d.running, p.SandboxID)
	d.mu.Unlock()
	return []byte(`{}`), nil
}

func sandboxExec(f fixture, id, sandboxID string) *nodev1.SignedCommand {
	return command(f, id, kinds.SandboxExec, fmt.Appendf(nil, `{"sandbox_id":%q,"tag":%q}`, sandboxID, id))
}

// TestLongSandboxCommandDelaysOnlyItsSandbox checks the executor's lanes
// (lanes.go) through the node's own execute loop: while a command for
// sandbox A is held in the driver, a command for sandbox B and a
// non-sandbox command (node.ping) both run and finish, but a second
// command for A, sent before them, does not start; it starts only once the
// first A command finished. The driver fails the test if two A commands
// ever run at once.
func TestLongSandboxCommandDelaysOnlyItsSandbox(t *testing.T) {
	f := newFixture(t)
	n, sim, key := openTestNode(t, f, time.Hour) // the fake clock never reaches it: final updates only
	d := &laneDriver{Sim: sim, t: t, entered: make(chan string, 8), release: make(chan struct{}), running: map[string]string{}}
	n.cfg.Driver = d
	e := startExecutor(t, n, key, noSecrets)
	var releaseOnce sync.Once
	releaseA := func() { releaseOnce.Do(func() { close(d.release) }) }
	t.Cleanup(releaseA) // before the executor stops (cleanups run last first), so a failed test ends

	e.work <- sandboxExec(f, "a1", sandboxA)
	if tag := receive(t, d.entered); tag != "a1" {
		t.Fatalf("driver entered %s, want a1", tag)
	}
	e.work <- sandboxExec(f, "a2", sandboxA)
	e.work <- sandboxExec(f, "b1", sandboxB)
	e.work <- command(f, "p1", kinds.NodePing, []byte("{}"))
	if tag := receive(t, d.entered); tag != "b1" {
		t.Fatalf("driver entered %s, want b1 (a2 must wait for a1)", tag)
	}
	got := map[string]string{}
	for range 2 {
		u := e.next()
		got[u.CommandId] = u.State
	}
	if got["b1"] != string(wire.StateSucceeded) || got["p1"] != string(wire.StateSucceeded) {
		t.Fatalf("updates while a1 runs: %v, want b1 and p1 succeeded", got)
	}
	select {
	case tag := <-d.entered:
		t.Fatalf("driver entered %s while a1 still runs", tag)
	default:
	}

	releaseA()
	wantUpdate(t, e.next(), "a1", string(wire.StateSucceeded), "")
	if tag := receive(t, d.entered); tag != "a2" {
		t.Fatalf("driver entered %s, want a2", tag)
	}
	wantUpdate(t, e.next(), "a2", string(wire.StateSucceeded), "")
	e.finish()
}

// TestLaneKey checks which lane a command runs in: a sandbox command
// naming a valid sandbox id runs in that sandbox's lane; anything else
// (another kind, a body or payload that does not parse, a missing or
// malformed id) in the serial lane.
func TestLaneKey(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		name string
		c    *nodev1.SignedCommand
		want string
	}{
		{"sandbox exec", command(f, "c1", kinds.SandboxExec, []byte(`{"sandbox_id":"`+sandboxA+`","argv":["true"]}`)), sandboxA},
		{"sandbox create", command(f, "c2", kinds.SandboxCreate, []byte(`{"sandbox_id":"`+sandboxB+`"}`)), sandboxB},
		{"sandbox checkpoint", command(f, "c3", kinds.SandboxCheckpoint, []byte(`{"sandbox_id":"`+sandboxB+`"}`)), sandboxB},
		{"other kind naming a sandbox", command(f, "c4", kinds.DiagRun, []byte(`{"sandbox_id":"`+sandboxA+`"}`)), serialLane},
		{"no sandbox id", command(f, "c5", kinds.SandboxDelete, []byte(`{}`)), serialLane},
		{"malformed sandbox id", command(f, "c6", kinds.SandboxDelete, []byte(`{"sandbox_id":"../etc"}`)), serialLane},
		{"payload not json", command(f, "c7", kinds.SandboxDelete, []byte(`{"sandbox_id":`)), serialLane},
		{"body not a command body", &nodev1.SignedCommand{Id: "c8", Body: []byte{0xff, 0xff}}, serialLane},
		{"no body", &nodev1.SignedCommand{Id: "c9"}, serialLane},
	} {
		if got := laneKey(tc.c); got != tc.want {
			t.Errorf("%s: lane %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestLanesBoundAndDrain checks the lanes themselves: with
// MaxSandboxLanes sandbox lanes held, one more sandbox lane waits (it is
// not dropped) while the serial lane still runs; releasing one held lane
// lets the waiting one run; once all are done, wait returns and no lane is
// left (each lane's goroutine exited with its empty queue).
func TestLanesBoundAndDrain(t *testing.T) {
	entered := make(chan string, MaxSandboxLanes+2)
	release := map[string]chan struct{}{}
	for i := range MaxSandboxLanes + 1 {
		release[fmt.Sprintf("c%d", i)] = make(chan struct{})
	}
	l := newLanes(func(c *nodev1.SignedCommand) {
		entered <- c.Id
		if r, ok := release[c.Id]; ok {
			<-r
		}
	})
	for i := range MaxSandboxLanes {
		l.submit(fmt.Sprintf("sbx%d", i), &nodev1.SignedCommand{Id: fmt.Sprintf("c%d", i)})
	}
	held := map[string]bool{}
	for range MaxSandboxLanes {
		held[receive(t, entered)] = true
	}
	last := fmt.Sprintf("c%d", MaxSandboxLanes)
	l.submit("sbx-extra", &nodev1.SignedCommand{Id: last})
	l.submit(serialLane, &nodev1.SignedCommand{Id: "serial"})
	if id := receive(t, entered); id != "serial" {
		t.Fatalf("%s ran with %d sandbox lanes held, want only the serial command", id, MaxSandboxLanes)
	}
	select {
	case id := <-entered:
		t.Fatalf("%s ran with %d sandbox lanes held", id, MaxSandboxLanes)
	default:
	}
	l.mu.Lock()
	waiting := len(l.queues["sbx-extra"])
	l.mu.Unlock()
	if waiting != 1 {
		t.Fatalf("the extra lane holds %d commands, want its 1 waiting", waiting)
	}
	close(release["c0"])
	if id := receive(t, entered); id != last {
		t.Fatalf("%s ran, want the waiting lane's %s", id, last)
	}
	for id := range release {
		if id != "c0" {
			close(release[id])
		}
	}
	l.wait()
	if len(l.queues) != 0 {
		t.Fatalf("lanes left after wait: %v", l.queues)
	}
	if len(held) != MaxSandboxLanes {
		t.Fatalf("%d distinct lanes ran at once, want %d", len(held), MaxSandboxLanes)
	}
}
