package daemon

import (
	"context"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// commandRecorder is the sim driver, recording the signed command each
// Run finds in its context.
type commandRecorder struct {
	*driver.Sim
	got chan []byte
}

func (r *commandRecorder) Run(ctx context.Context, kind string, payload []byte) ([]byte, error) {
	r.got <- driver.CommandFrom(ctx)
	return r.Sim.Run(ctx, kind, payload)
}

// TestDriverGetsVerifiedSignedCommand: the driver's Run finds the signed
// command it runs in its context (driver.CommandFrom), exactly as the
// control plane signed it, so a driver that hands it to the root helper
// passes on the worker's signature, not the node's word; a command the
// node refuses never reaches the driver.
func TestDriverGetsVerifiedSignedCommand(t *testing.T) {
	f := newFixture(t)
	n, sim, key := openTestNode(t, f, -1)
	rec := &commandRecorder{Sim: sim, got: make(chan []byte, 4)}
	n.cfg.Driver = rec
	e := startExecutor(t, n, key, noSecrets)
	c := command(f, "c1", kinds.NodePing, []byte("{}"))
	e.work <- c
	if u := e.next(); u.State != string(wire.StateRunning) {
		t.Fatalf("first update %s, want running", u.State)
	}
	wantUpdate(t, e.next(), "c1", string(wire.StateSucceeded), "")
	var got nodev1.SignedCommand
	if err := proto.Unmarshal(<-rec.got, &got); err != nil {
		t.Fatalf("driver got no signed command: %v", err)
	}
	if !proto.Equal(&got, c) {
		t.Fatalf("driver got %v, want the verified command %v", &got, c)
	}
	other := f.sign(f.body(func(b *nodev1.CommandBody) { b.CommandId, b.NodeId = "c2", "n2" }))
	e.work <- other
	wantUpdate(t, e.next(), "c2", string(wire.StateCancelled), ReasonWrongNode)
	e.finish()
	if len(rec.got) != 0 {
		t.Fatal("a refused command reached the driver")
	}
}
