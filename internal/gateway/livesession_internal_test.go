package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// A tunnel asked for while the node's session is still opening (the node
// already holds its Welcome, the gateway is still sending the desired
// state) waits for the session instead of failing with INVALID_STATE; it
// gets nil when the session ends first, when the wait runs out, or when
// the node has no session at all.
func TestLiveSessionWaitsForAnOpeningSession(t *testing.T) {
	for _, c := range []struct {
		name string
		end  func(g *Gateway, s *session, clk *clock.Fake)
		want bool
	}{
		{"welcomed", func(g *Gateway, s *session, _ *clock.Fake) {
			g.mu.Lock()
			s.send = func(*nodev1.ServerMessage) error { return nil }
			g.mu.Unlock()
			close(s.ready)
		}, true},
		{"session ended", func(_ *Gateway, s *session, _ *clock.Fake) { s.cancel(errSuperseded) }, false},
		{"timed out", func(_ *Gateway, _ *session, clk *clock.Fake) { clk.Advance(TunnelOpenTimeout) }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			clk := clock.NewFake(time.Unix(1_800_000_000, 0))
			g := &Gateway{cfg: Config{Clock: clk}, sessions: map[string]*session{}}
			if got := g.liveSession(context.Background(), "n1"); got != nil {
				t.Fatalf("no session: got %v, want nil", got)
			}
			sctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			s := &session{id: "s1", nodeID: "n1", ctx: sctx, cancel: cancel, ready: make(chan struct{})}
			g.sessions["n1"] = s
			got := make(chan *session, 1)
			go func() { got <- g.liveSession(context.Background(), "n1") }()
			ctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
			defer stop()
			if err := clk.BlockUntil(ctx, 1); err != nil {
				t.Fatalf("liveSession did not wait for the opening session: %v", err)
			}
			c.end(g, s, clk)
			if r := <-got; (r == s) != c.want || (r != nil && r != s) {
				t.Fatalf("liveSession = %v, want session %v", r, c.want)
			}
		})
	}
}
