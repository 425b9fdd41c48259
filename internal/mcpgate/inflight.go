package mcpgate

import "sync"

// inFlight counts each caller's tool calls in flight and refuses one more
// than max at once: a semaphore per caller that never queues, so an agent
// that floods the gate is told at once instead of piling up work.
type inFlight struct {
	mu  sync.Mutex
	max int
	n   map[string]int
}

func newInFlight(max int) *inFlight { return &inFlight{max: max, n: map[string]int{}} }

// acquire takes one of caller's slots; ok is false, and nothing is taken,
// when all are in use. release gives the slot back (call it once).
func (f *inFlight) acquire(caller string) (release func(), ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n[caller] >= f.max {
		return nil, false
	}
	f.n[caller]++
	var once sync.Once
	return func() { once.Do(func() { f.release(caller) }) }, true
}

func (f *inFlight) release(caller string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n[caller]--; f.n[caller] <= 0 {
		delete(f.n, caller)
	}
}
