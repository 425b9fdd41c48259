// Package afterreply holds work a module wants done once the API has
// written its answer, rather than while the answer is being written.
//
// A warm claim answers before its host applies it: it commits the claim
// and its queued, unsigned update, then wakes the signing worker and the
// warm-pool reconciler. Woken at once, those (the signer, the gateway, bcd
// in a single-process install, a refill) compete for the CPU with the
// answer still being encoded and written, and on a small machine they add
// more to the caller's wait than the claim's own work. The API envelope
// therefore gives each call a List and runs it right after it has written
// and flushed the answer; outside an API call (the workers, tests of the
// modules) Do runs the work at once. Only wake-ups belong here: nothing a
// caller's answer depends on, and nothing that must happen if the process
// dies before the answer is written (the work woken is committed and
// found by the workers' own polls).
package afterreply

import (
	"context"
	"sync"
)

// List is the work deferred by one call. Its zero value is not usable:
// make one with With.
type List struct {
	mu  sync.Mutex
	fns []func()
	ran bool
}

type ctxKey struct{}

// With returns ctx carrying a new List; the caller must Run it.
func With(ctx context.Context) (context.Context, *List) {
	l := &List{}
	return context.WithValue(ctx, ctxKey{}, l), l
}

// Do runs fn once the answer of ctx's call is written when ctx carries a
// List not yet run, and at once otherwise.
func Do(ctx context.Context, fn func()) {
	if l, ok := ctx.Value(ctxKey{}).(*List); ok {
		l.mu.Lock()
		if !l.ran {
			l.fns = append(l.fns, fn)
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
	}
	fn()
}

// Run runs the deferred work in the order it was deferred, once; work
// deferred after Run runs at once.
func (l *List) Run() {
	l.mu.Lock()
	fns := l.fns
	l.fns, l.ran = nil, true
	l.mu.Unlock()
	for _, fn := range fns {
		fn()
	}
}
