package tickets_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/tickets"
)

// TestMemorySpendsOnce checks the in-memory store: a jti is spent once;
// a second spend is ErrSpent for as long as it is kept, which is until
// Retention after its ticket's expiry (a verifier whose clock is up to
// MaxSkew behind still finds it spent), and only then forgotten.
func TestMemorySpendsOnce(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(t0)
	m := tickets.NewMemory(clk, 0)
	exp := t0.Add(tickets.Lifetime)
	if err := m.Spend(ctx, "tk_a", exp); err != nil {
		t.Fatal(err)
	}
	if err := m.Spend(ctx, "tk_a", exp); !errors.Is(err, tickets.ErrSpent) {
		t.Fatalf("second spend: %v, want ErrSpent", err)
	}
	clk.Set(exp.Add(tickets.Retention))
	if err := m.Spend(ctx, "tk_a", exp); !errors.Is(err, tickets.ErrSpent) {
		t.Fatalf("spend at expiry+Retention: %v, want ErrSpent (still kept)", err)
	}
	clk.Set(exp.Add(tickets.Retention + time.Millisecond))
	if err := m.Spend(ctx, "tk_b", exp.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if m.Len() != 1 {
		t.Fatalf("held %d jtis after tk_a's time, want only tk_b", m.Len())
	}
}

// TestMemoryFullRefuses checks the bound: a store holding capacity
// unexpired jtis refuses another (ErrFull, fail closed) rather than
// forget one, and takes new ones again once old ones are past their time.
// Through Redeem the refusal is ReasonSpentStoreFull.
func TestMemoryFullRefuses(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(t0)
	m := tickets.NewMemory(clk, 2)
	if err := m.Spend(ctx, "tk_1", t0.Add(10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := m.Spend(ctx, "tk_2", t0.Add(tickets.Lifetime)); err != nil {
		t.Fatal(err)
	}
	if err := m.Spend(ctx, "tk_3", t0.Add(tickets.Lifetime)); !errors.Is(err, tickets.ErrFull) {
		t.Fatalf("spend into a full store: %v, want ErrFull", err)
	}
	f := newFixture(t)
	if _, r := f.verifier().Redeem(ctx, f.raw(t, body()), t0, want(), m); r != tickets.ReasonSpentStoreFull {
		t.Fatalf("redeem into a full store: %q, want %q", r, tickets.ReasonSpentStoreFull)
	}
	if err := m.Spend(ctx, "tk_2", t0.Add(tickets.Lifetime)); !errors.Is(err, tickets.ErrSpent) {
		t.Fatalf("a spent jti in a full store: %v, want ErrSpent", err)
	}
	clk.Set(t0.Add(10*time.Second + tickets.Retention + time.Millisecond))
	if err := m.Spend(ctx, "tk_3", t0.Add(tickets.Lifetime)); err != nil {
		t.Fatalf("spend once tk_1 is past its time: %v", err)
	}
	if err := m.Spend(ctx, "tk_4", t0.Add(tickets.Lifetime)); !errors.Is(err, tickets.ErrFull) {
		t.Fatalf("spend into the full store again: %v, want ErrFull", err)
	}
}

// TestMemoryConcurrentSpend checks that of many concurrent spends of one
// jti exactly one succeeds (run with -race).
func TestMemoryConcurrentSpend(t *testing.T) {
	m := tickets.NewMemory(clock.NewFake(t0), 0)
	const n = 32
	errsOf := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errsOf[i] = m.Spend(context.Background(), "tk_same", t0.Add(tickets.Lifetime))
		}()
	}
	wg.Wait()
	ok := 0
	for _, err := range errsOf {
		switch {
		case err == nil:
			ok++
		case !errors.Is(err, tickets.ErrSpent):
			t.Fatalf("concurrent spend: %v", err)
		}
	}
	if ok != 1 {
		t.Fatalf("%d concurrent spends of one jti succeeded, want exactly 1", ok)
	}
}

// TestMemoryDropsInExpiryOrder checks that entries spent out of expiry
// order are forgotten each at its own time, never earlier.
func TestMemoryDropsInExpiryOrder(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(t0)
	m := tickets.NewMemory(clk, 0)
	offsets := []int{50, 10, 40, 20, 30}
	for _, s := range offsets {
		if err := m.Spend(ctx, fmt.Sprint("tk_", s), t0.Add(time.Duration(s)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []int{10, 20, 30, 40, 50} {
		keep := t0.Add(time.Duration(s)*time.Second + tickets.Retention)
		clk.Set(keep)
		if err := m.Spend(ctx, fmt.Sprint("tk_", s), keep); !errors.Is(err, tickets.ErrSpent) {
			t.Fatalf("tk_%d at its last kept instant: %v, want ErrSpent", s, err)
		}
		clk.Set(keep.Add(time.Millisecond))
		if err := m.Spend(ctx, fmt.Sprint("tk_", s), keep); err != nil {
			t.Fatalf("tk_%d after its time: %v, want forgotten", s, err)
		}
	}
}

// TestRestoreKeepsTheLaterExpiry: a jti restored twice (a record holding
// it twice) is kept until the later of its times, not forgotten when the
// earlier one passes.
func TestRestoreKeepsTheLaterExpiry(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewFake(t0)
	m := tickets.NewMemory(clk, 0)
	m.Restore("tk_a", t0.Add(time.Second))
	m.Restore("tk_a", t0.Add(time.Hour))
	clk.Set(t0.Add(time.Second + tickets.Retention + time.Millisecond))
	if err := m.Spend(ctx, "tk_b", t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := m.Spend(ctx, "tk_a", t0.Add(time.Hour)); !errors.Is(err, tickets.ErrSpent) {
		t.Fatalf("tk_a after its earlier time: %v, want ErrSpent (kept until the later one)", err)
	}
}
