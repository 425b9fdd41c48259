package ratelimit

import (
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
)

// TestPerKeyAllowsNThenWaits: n events pass at once, the next is refused
// with the wait until one is refilled, another key is not affected, and
// after the wait one more passes.
func TestPerKeyAllowsNThenWaits(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	p := New(clk, 10, time.Minute)
	for i := range 10 {
		if w := p.Take("alice"); w != 0 {
			t.Fatalf("event %d refused, wait %v", i+1, w)
		}
	}
	w := p.Take("alice")
	if w < 5*time.Second || w > 6*time.Second {
		t.Fatalf("11th event: wait %v, want about 6s", w)
	}
	if w := p.Take("bob"); w != 0 {
		t.Fatalf("another key refused: %v", w)
	}
	clk.Advance(6 * time.Second)
	if w := p.Take("alice"); w != 0 {
		t.Fatalf("after the wait: refused %v", w)
	}
	if w := p.Take("alice"); w == 0 {
		t.Fatal("a second event after one refill passed")
	}
}
