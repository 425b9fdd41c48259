// Package clock injects time, so that expiry, freshness, rotation and the
// waits built on them (timers, tickers) are testable without sleeping.
package clock

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Clock tells the time and makes timers and tickers that run on that time.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// NewTimer returns a Timer that fires once, d from now.
	NewTimer(d time.Duration) Timer
	// NewTicker returns a Ticker that fires every d (d > 0).
	NewTicker(d time.Duration) Ticker
	// After is NewTimer(d).C(), for a wait that is never stopped.
	After(d time.Duration) <-chan time.Time
}

// Timer is the part of *time.Timer that code waits on.
type Timer interface {
	// C is the channel the timer sends its time on when it fires.
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether it stopped
	// a pending timer. No value is received from C after Stop returns.
	Stop() bool
	// Reset makes the timer fire d from now instead; it reports whether
	// the timer was pending. No stale value is received after it returns.
	Reset(d time.Duration) bool
}

// Ticker is the part of *time.Ticker that code waits on.
type Ticker interface {
	// C is the channel the ticker sends its ticks on.
	C() <-chan time.Time
	// Stop turns the ticker off.
	Stop()
	// Reset stops the ticker and makes it tick every d from now.
	Reset(d time.Duration)
}

// Real is the wall clock.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// NewTimer returns a wall-clock timer (time.NewTimer).
func (Real) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

// NewTicker returns a wall-clock ticker (time.NewTicker).
func (Real) NewTicker(d time.Duration) Ticker { return realTicker{time.NewTicker(d)} }

// After returns time.After(d).
func (Real) After(d time.Duration) <-chan time.Time { return time.After(d) }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time        { return r.t.C }
func (r realTimer) Stop() bool                 { return r.t.Stop() }
func (r realTimer) Reset(d time.Duration) bool { return r.t.Reset(d) }

type realTicker struct{ t *time.Ticker }

func (r realTicker) C() <-chan time.Time   { return r.t.C }
func (r realTicker) Stop()                 { r.t.Stop() }
func (r realTicker) Reset(d time.Duration) { r.t.Reset(d) }

// Fake is a settable clock for tests; it is safe for concurrent use. Its
// timers and tickers fire only when Advance or Set moves it to or past
// their time, never by wall time.
type Fake struct {
	mu      sync.Mutex
	t       time.Time
	waiters []*fakeWaiter // pending timers and tickers
	changed chan struct{} // made by BlockUntil, closed when waiters change
}

// fakeWaiter is one pending Fake timer or ticker.
type fakeWaiter struct {
	f      *Fake
	at     time.Time     // when it fires next
	period time.Duration // > 0 for a ticker
	ch     chan time.Time
}

// NewFake returns a Fake set to t.
func NewFake(t time.Time) *Fake { return &Fake{t: t} }

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.t
}

// Set moves the clock to t (forwards or backwards) and fires the timers
// and tickers due by t.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.t = t
	f.fire()
}

// Advance moves the clock forward by d and fires the timers and tickers
// due by the new time.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.t = f.t.Add(d)
	f.fire()
}

// NewTimer returns a timer that fires when the clock reaches d from now
// (at once when d <= 0).
func (f *Fake) NewTimer(d time.Duration) Timer {
	w := &fakeWaiter{f: f, ch: make(chan time.Time, 1)}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.schedule(w, d)
	return fakeTimer{w}
}

// NewTicker returns a ticker that fires each time the clock passes another
// d from now. Like a time.Ticker it drops ticks a slow receiver misses.
func (f *Fake) NewTicker(d time.Duration) Ticker {
	if d <= 0 {
		panic("clock: non-positive interval for NewTicker")
	}
	w := &fakeWaiter{f: f, period: d, ch: make(chan time.Time, 1)}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.schedule(w, d)
	return fakeTicker{w}
}

// After is NewTimer(d).C().
func (f *Fake) After(d time.Duration) <-chan time.Time { return f.NewTimer(d).C() }

// Waiters returns how many timers and tickers are pending: created or
// reset, and neither fired (timers), nor stopped.
func (f *Fake) Waiters() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.waiters)
}

// BlockUntil waits until at least n timers and tickers are pending, so a
// test advances the clock only once the code under test waits on it. It
// returns ctx's error if ctx ends first.
func (f *Fake) BlockUntil(ctx context.Context, n int) error {
	for {
		f.mu.Lock()
		if f.changed == nil {
			f.changed = make(chan struct{})
		}
		pending, changed := len(f.waiters), f.changed
		f.mu.Unlock()
		if pending >= n {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// schedule makes w pending, due d from now; a timer due now fires at once.
// f.mu is held.
func (f *Fake) schedule(w *fakeWaiter, d time.Duration) {
	w.at = f.t.Add(d)
	f.waiters = append(f.waiters, w)
	f.poke()
	f.fire()
}

// unschedule removes w from the pending waiters and drains its channel, so
// no stale value is received after Stop or Reset (as with time.Timer since
// Go 1.23). It reports whether w was pending. f.mu is held.
func (f *Fake) unschedule(w *fakeWaiter) bool {
	select {
	case <-w.ch:
	default:
	}
	i := slices.Index(f.waiters, w)
	if i < 0 {
		return false
	}
	f.waiters = slices.Delete(f.waiters, i, i+1)
	f.poke()
	return true
}

// fire sends on every waiter due by f.t, earliest first: a timer once
// (then it is no longer pending), a ticker once and again a period later.
// f.mu is held.
func (f *Fake) fire() {
	slices.SortStableFunc(f.waiters, func(a, b *fakeWaiter) int { return a.at.Compare(b.at) })
	var keep []*fakeWaiter
	fired := false
	for _, w := range f.waiters {
		if w.at.After(f.t) {
			keep = append(keep, w)
			continue
		}
		select {
		case w.ch <- w.at:
		default: // a tick the receiver has not taken yet: drop this one
		}
		fired = true
		if w.period > 0 {
			for !w.at.After(f.t) {
				w.at = w.at.Add(w.period)
			}
			keep = append(keep, w)
		}
	}
	f.waiters = keep
	if fired {
		f.poke()
	}
}

// poke tells BlockUntil that the waiters changed. f.mu is held.
func (f *Fake) poke() {
	if f.changed != nil {
		close(f.changed)
		f.changed = nil
	}
}

type fakeTimer struct{ *fakeWaiter }

// C returns the channel the timer sends on.
func (w fakeTimer) C() <-chan time.Time { return w.ch }

// Stop stops the timer and reports whether it was pending.
func (w fakeTimer) Stop() bool { return w.stop() }

// Reset makes the timer due d from now and reports whether it was pending.
func (w fakeTimer) Reset(d time.Duration) bool { return w.reset(d) }

type fakeTicker struct{ *fakeWaiter }

// C returns the channel the ticker sends on.
func (w fakeTicker) C() <-chan time.Time { return w.ch }

// Stop stops the ticker.
func (w fakeTicker) Stop() { w.stop() }

// Reset makes the ticker tick every d from now.
func (w fakeTicker) Reset(d time.Duration) {
	if d <= 0 {
		panic("clock: non-positive interval for Ticker.Reset")
	}
	w.reset(d)
}

func (w *fakeWaiter) stop() bool {
	w.f.mu.Lock()
	defer w.f.mu.Unlock()
	return w.f.unschedule(w)
}

func (w *fakeWaiter) reset(d time.Duration) bool {
	w.f.mu.Lock()
	defer w.f.mu.Unlock()
	pending := w.f.unschedule(w)
	if w.period > 0 {
		w.period = d
	}
	w.f.schedule(w, d)
	return pending
}

// Offset is Base (the real clock when nil) read By later: a machine whose
// clock is off by a fixed amount (By negative: slow). Timers and tickers
// run as Base's, since durations do not depend on the offset. Tests use
// it for a node whose clock is wrong.
type Offset struct {
	Base Clock
	By   time.Duration
}

func (o Offset) base() Clock {
	if o.Base == nil {
		return Real{}
	}
	return o.Base
}

// Now returns Base's time plus By.
func (o Offset) Now() time.Time { return o.base().Now().Add(o.By) }

// NewTimer is Base's timer.
func (o Offset) NewTimer(d time.Duration) Timer { return o.base().NewTimer(d) }

// NewTicker is Base's ticker.
func (o Offset) NewTicker(d time.Duration) Ticker { return o.base().NewTicker(d) }

// After is Base's After.
func (o Offset) After(d time.Duration) <-chan time.Time { return o.base().After(d) }
