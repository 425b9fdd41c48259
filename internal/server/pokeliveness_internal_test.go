package server

import (
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
)

// TestPokeLiveness: the poke listener is live only once it heard this
// process's own heartbeat and for pokeBeatStale after the last one; a
// silence or a stopped listener starts a new epoch, and another
// process's beat or poke does not count.
func TestPokeLiveness(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	l := newPokeLiveness(clk)
	if _, ok := l.live(); ok {
		t.Fatal("live before any heartbeat was heard")
	}
	if l.heard("beat.pother") || l.heard("access.changed") {
		t.Fatal("another payload taken for this process's heartbeat")
	}
	if !l.heard(l.payload) {
		t.Fatal("own heartbeat not recognised")
	}
	e1, ok := l.live()
	if !ok {
		t.Fatal("not live after its heartbeat")
	}
	clk.Advance(pokeBeatStale)
	if e, ok := l.live(); !ok || e != e1 {
		t.Fatalf("live %v epoch %d at the stale bound, want live in epoch %d", ok, e, e1)
	}
	clk.Advance(time.Millisecond)
	if _, ok := l.live(); ok {
		t.Fatal("live after a silence longer than pokeBeatStale")
	}
	l.heard(l.payload)
	e2, ok := l.live()
	if !ok || e2 == e1 {
		t.Fatalf("after a silence: live %v epoch %d, want a new epoch after %d", ok, e2, e1)
	}
	l.down()
	if e, ok := l.live(); ok || e == e2 {
		t.Fatalf("after the listener stopped: live %v epoch %d", ok, e)
	}
}
