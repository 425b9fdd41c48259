package gateway

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// Stop, which serve and dev call when the shutdown grace ends, returns
// only once every session's handler has returned and closed its session in
// the registry: the control plane closes its database next, and a session
// closing after that logged "ERROR close session … sql: database is
// closed" at shutdown.
func TestStopWaitsForSessionsToClose(t *testing.T) {
	f := newAuthFixture(t)
	// A slow registry write: without the wait, Stop returns long before it
	// ends (with it, its length does not matter).
	f.reg.beforeClose = func() { time.Sleep(50 * time.Millisecond) }
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := f.g.GRPCServer()
	go func() { _ = s.Serve(lis) }()
	f.addr = lis.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go f.g.Run(ctx)
	stream, err := nodev1.NewGatewayClient(f.dial(t, &f.good)).Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Hello{Hello: &nodev1.Hello{NodeId: "n-good", BootId: "boot-1"}}}); err != nil {
		t.Fatal(err)
	}
	if m, err := stream.Recv(); err != nil || m.GetWelcome() == nil {
		t.Fatalf("welcome: %v %v", m, err)
	}
	s.Stop()
	f.reg.mu.Lock()
	defer f.reg.mu.Unlock()
	if len(f.reg.closed) != 1 {
		t.Fatalf("Stop returned with %d of 1 sessions closed in the registry", len(f.reg.closed))
	}
}
