package clock

import (
	"context"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// fired reports whether ch holds a value, and which.
func fired(ch <-chan time.Time) (time.Time, bool) {
	select {
	case v := <-ch:
		return v, true
	default:
		return time.Time{}, false
	}
}

// TestFakeTimerFiresOnAdvance checks that a Fake timer fires exactly when
// the clock reaches its time, once, with that time, and never by wall time.
func TestFakeTimerFiresOnAdvance(t *testing.T) {
	f := NewFake(t0)
	tm := f.NewTimer(time.Minute)
	if f.Waiters() != 1 {
		t.Fatalf("waiters = %d, want 1", f.Waiters())
	}
	f.Advance(time.Minute - time.Nanosecond)
	if _, ok := fired(tm.C()); ok {
		t.Fatal("fired before its time")
	}
	f.Advance(time.Nanosecond)
	if v, ok := fired(tm.C()); !ok || !v.Equal(t0.Add(time.Minute)) {
		t.Fatalf("at its time: fired %v %v, want %v", ok, v, t0.Add(time.Minute))
	}
	f.Advance(time.Hour)
	if _, ok := fired(tm.C()); ok {
		t.Fatal("a timer fired twice")
	}
	if f.Waiters() != 0 || tm.Stop() {
		t.Fatalf("a fired timer is still pending (waiters %d)", f.Waiters())
	}
}

// TestFakeTimerStopAndReset checks Stop (no value after it, reports
// whether pending), Reset (due from the new now, drops a stale value),
// zero and negative durations (fire at once) and Set backwards (fires
// nothing).
func TestFakeTimerStopAndReset(t *testing.T) {
	f := NewFake(t0)
	tm := f.NewTimer(time.Second)
	if !tm.Stop() {
		t.Fatal("Stop of a pending timer reports false")
	}
	f.Advance(time.Hour)
	if _, ok := fired(tm.C()); ok {
		t.Fatal("a stopped timer fired")
	}
	if tm.Reset(time.Minute) {
		t.Fatal("Reset of a stopped timer reports it pending")
	}
	f.Advance(59 * time.Second)
	if _, ok := fired(tm.C()); ok {
		t.Fatal("reset timer fired early")
	}
	f.Advance(time.Second)
	if _, ok := fired(tm.C()); !ok {
		t.Fatal("reset timer did not fire")
	}

	// A value fired but not received is dropped by Reset.
	tm = f.NewTimer(time.Second)
	f.Advance(time.Second)
	tm.Reset(time.Minute)
	if _, ok := fired(tm.C()); ok {
		t.Fatal("stale value received after Reset")
	}

	for _, d := range []time.Duration{0, -time.Second} {
		if _, ok := fired(f.NewTimer(d).C()); !ok {
			t.Fatalf("NewTimer(%v) did not fire at once", d)
		}
	}

	tm = f.NewTimer(time.Minute)
	f.Set(f.Now().Add(-time.Hour))
	if _, ok := fired(tm.C()); ok {
		t.Fatal("fired when the clock went back")
	}
	f.Set(f.Now().Add(time.Hour + time.Minute))
	if _, ok := fired(tm.C()); !ok {
		t.Fatal("did not fire when Set past its time")
	}
}

// TestFakeAfter checks After.
func TestFakeAfter(t *testing.T) {
	f := NewFake(t0)
	ch := f.After(time.Hour)
	f.Advance(time.Hour)
	if v, ok := fired(ch); !ok || !v.Equal(t0.Add(time.Hour)) {
		t.Fatalf("After: %v %v", v, ok)
	}
}

// TestFakeTicker checks that a ticker fires once per period passed, drops
// ticks its receiver missed (as time.Ticker does), follows Reset and
// stops.
func TestFakeTicker(t *testing.T) {
	f := NewFake(t0)
	tk := f.NewTicker(10 * time.Second)
	for i := 1; i <= 3; i++ {
		f.Advance(10 * time.Second)
		if v, ok := fired(tk.C()); !ok || !v.Equal(t0.Add(time.Duration(i)*10*time.Second)) {
			t.Fatalf("tick %d: %v %v", i, v, ok)
		}
	}
	f.Advance(35 * time.Second) // three periods at once: one tick
	if _, ok := fired(tk.C()); !ok {
		t.Fatal("no tick after three periods")
	}
	if _, ok := fired(tk.C()); ok {
		t.Fatal("missed ticks were queued")
	}
	f.Advance(5 * time.Second) // the next period boundary
	if _, ok := fired(tk.C()); !ok {
		t.Fatal("ticker lost its phase")
	}
	tk.Reset(time.Minute)
	f.Advance(59 * time.Second)
	if _, ok := fired(tk.C()); ok {
		t.Fatal("reset ticker ticked early")
	}
	f.Advance(time.Second)
	if _, ok := fired(tk.C()); !ok {
		t.Fatal("reset ticker did not tick")
	}
	tk.Stop()
	f.Advance(time.Hour)
	if _, ok := fired(tk.C()); ok || f.Waiters() != 0 {
		t.Fatalf("stopped ticker ticked (waiters %d)", f.Waiters())
	}
}

// TestFakeFiresInOrder checks that one Advance over several timers fires
// them all, each with its own time.
func TestFakeFiresInOrder(t *testing.T) {
	f := NewFake(t0)
	a, b := f.NewTimer(2*time.Second), f.NewTimer(time.Second)
	f.Advance(time.Minute)
	va, oka := fired(a.C())
	vb, okb := fired(b.C())
	if !oka || !okb || !va.Equal(t0.Add(2*time.Second)) || !vb.Equal(t0.Add(time.Second)) {
		t.Fatalf("a %v %v, b %v %v", va, oka, vb, okb)
	}
}

// TestFakeBlockUntil checks that BlockUntil returns once another
// goroutine waits on the clock, so a test can advance it then without a
// race, and that it gives up with its context.
func TestFakeBlockUntil(t *testing.T) {
	f := NewFake(t0)
	got := make(chan time.Time)
	go func() { got <- <-f.After(time.Minute) }()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := f.BlockUntil(ctx, 1); err != nil {
		t.Fatal(err)
	}
	f.Advance(time.Minute)
	if v := <-got; !v.Equal(t0.Add(time.Minute)) {
		t.Fatalf("got %v", v)
	}
	short, cancelShort := context.WithCancel(context.Background())
	cancelShort()
	if err := f.BlockUntil(short, 1); err == nil {
		t.Fatal("BlockUntil returned nil with nothing waiting and its context done")
	}
}

// TestFakeConcurrent exercises the Fake from many goroutines (for -race).
func TestFakeConcurrent(t *testing.T) {
	f := NewFake(t0)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				tm := f.NewTimer(time.Second)
				f.Advance(time.Second)
				<-tm.C()
				tm.Reset(time.Second)
				tm.Stop()
			}
		}()
	}
	wg.Wait()
}

// TestReal checks that the real clock's timers and tickers are wired to
// time's (briefly: a millisecond each).
func TestReal(t *testing.T) {
	var c Clock = Real{}
	tm := c.NewTimer(time.Millisecond)
	<-tm.C()
	tk := c.NewTicker(time.Millisecond)
	<-tk.C()
	tk.Reset(time.Millisecond)
	<-tk.C()
	tk.Stop()
	<-c.After(time.Millisecond)
	if tm.Reset(time.Hour) {
		t.Fatal("Reset of a fired timer reports it pending")
	}
	if !tm.Stop() {
		t.Fatal("Stop of a reset timer reports it not pending")
	}
}
