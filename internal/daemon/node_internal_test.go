package daemon

import (
	"context"
	"crypto/x509"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

func TestRenewAtJitterBounds(t *testing.T) {
	nb := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	life := 24 * time.Hour
	n := &Node{chain: []*x509.Certificate{{NotBefore: nb, NotAfter: nb.Add(life)}}}
	lo, hi := nb.Add(life*2/3-life/10), nb.Add(life*2/3+life/10)
	seen := map[time.Time]bool{}
	for i := 0; i < 500; i++ {
		at := n.renewAt()
		if at.Before(lo) || at.After(hi) {
			t.Fatalf("renew at %v, outside [%v, %v]", at, lo, hi)
		}
		seen[at] = true
	}
	if len(seen) < 100 {
		t.Fatalf("only %d distinct renewal times in 500: no jitter", len(seen))
	}
}

// TestSessionRenewsOnItsClock checks the session loop's renewal on the
// node's injected clock (a fake: no wall time passes): nothing before the
// earliest renewal time, a renewal once the clock passes the latest; a
// failed renewal keeps the session and is retried a minute later by the
// clock; a renewal that succeeds ends the session (nil) so the next one
// connects with the new certificate.
func TestSessionRenewsOnItsClock(t *testing.T) {
	nb := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	life := 24 * time.Hour
	clk := clock.NewFake(nb)
	n := &Node{cfg: Config{Clock: clk, Log: slog.New(slog.DiscardHandler)}, rec: &JoinRecord{NodeID: "n1"},
		chain: []*x509.Certificate{{NotBefore: nb, NotAfter: nb.Add(life)}}, reports: newReports(), hev: newHelperEvents(), outbox: newOutbox(DefaultResendAfter)}
	renewals := make(chan chan error)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- n.serve(ctx, sessionIO{
			send:  func(*nodev1.NodeMessage) error { return nil },
			work:  make(chan *nodev1.SignedCommand),
			recvd: make(chan *nodev1.ServerMessage), recvErr: make(chan error),
			renew: func(context.Context) error {
				answer := make(chan error)
				renewals <- answer
				return <-answer
			},
		})
	}()

	waitTimers(t, clk, 1)
	clk.Set(nb.Add(life*2/3 - life/10 - time.Second))
	if clk.Waiters() != 1 {
		t.Fatal("renewal timer fired before the earliest renewal time")
	}
	clk.Set(nb.Add(life*2/3 + life/10))
	receive(t, renewals) <- errors.New("gateway unreachable")

	waitTimers(t, clk, 1) // the retry, a minute from now by the clock
	clk.Advance(time.Minute - time.Second)
	if clk.Waiters() != 1 {
		t.Fatal("renewal retried before a minute passed")
	}
	select {
	case err := <-done:
		t.Fatalf("session ended after a failed renewal: %v", err)
	default:
	}
	clk.Advance(time.Second)
	receive(t, renewals) <- nil
	if err := receive(t, done); err != nil {
		t.Fatalf("session after a renewal: %v, want nil (reconnect)", err)
	}
}
