package tickets

import (
	"container/heap"
	"context"
	"sync"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
)

// DefaultMemoryCapacity is how many unexpired jtis a Memory store made
// with capacity <= 0 holds. A jti is kept Lifetime+Retention at most, and
// tunnels.open is rate limited per identity, so a node sees far fewer
// tickets in that time; each entry costs about a hundred bytes.
const DefaultMemoryCapacity = 16384

// Memory is the spent-ticket store of one bcd process: the jtis it
// accepted, each kept until Retention after its ticket's expiry (by the
// injected clock), after which Verify refuses the ticket as expired anyway.
// It is bounded: when it holds capacity unexpired jtis it refuses to spend
// another (ErrFull) rather than forget one that might be replayed.
//
// A restart forgets every jti; a ticket spent before the restart is then
// refused only by its expiry, so bcd must not accept tickets for Lifetime
// after it starts, or must accept the replay risk for that minute (the
// gateway's database store has spent the jti in any case).
//
// It is safe for concurrent use.
type Memory struct {
	clk      clock.Clock
	capacity int

	mu    sync.Mutex
	until map[string]time.Time // jti -> kept until
	order expiryHeap           // the same entries, earliest first
}

// NewMemory returns an empty store on clk holding at most capacity
// unexpired jtis (DefaultMemoryCapacity when capacity <= 0).
func NewMemory(clk clock.Clock, capacity int) *Memory {
	if capacity <= 0 {
		capacity = DefaultMemoryCapacity
	}
	return &Memory{clk: clk, capacity: capacity, until: map[string]time.Time{}}
}

// Spend records jti, whose ticket expires at expires. It returns ErrSpent
// when jti is held already and ErrFull when the store holds capacity
// unexpired jtis. Entries kept past their time are dropped first.
func (m *Memory) Spend(_ context.Context, jti string, expires time.Time) error {
	now := m.clk.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dropExpired(now)
	if _, held := m.until[jti]; held {
		return ErrSpent
	}
	if len(m.until) >= m.capacity {
		return ErrFull
	}
	keep := expires.Add(Retention)
	m.until[jti] = keep
	heap.Push(&m.order, expiryEntry{jti: jti, until: keep})
	return nil
}

// Restore records jti, whose ticket expires at expires, as Spend does but
// past the store's capacity and without answering ErrSpent: it reads back
// a store's own record (spentfile), which must never fail for want of room
// nor forget an entry; until enough of them expire, Spend answers ErrFull.
func (m *Memory) Restore(jti string, expires time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	keep := expires.Add(Retention)
	if old, held := m.until[jti]; held && !keep.After(old) {
		return
	}
	m.until[jti] = keep
	heap.Push(&m.order, expiryEntry{jti: jti, until: keep})
}

// Len returns how many jtis the store holds (some may be past their time
// until the next Spend drops them).
func (m *Memory) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.until)
}

// Each calls fn with every jti held that is not past its keeping time,
// and the expiry it was spent with (a store that persists them,
// spentfile, writes them out with it). fn must not call m.
func (m *Memory) Each(fn func(jti string, expires time.Time)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dropExpired(m.clk.Now())
	for jti, until := range m.until {
		fn(jti, until.Add(-Retention))
	}
}

// dropExpired forgets every jti kept until before now. m.mu is held.
func (m *Memory) dropExpired(now time.Time) {
	for m.order.Len() > 0 && m.order[0].until.Before(now) {
		e := heap.Pop(&m.order).(expiryEntry)
		// A jti Restore kept longer has a later entry too: only the
		// entry of its current time forgets it.
		if m.until[e.jti].Equal(e.until) {
			delete(m.until, e.jti)
		}
	}
}

// expiryEntry is one held jti and the time it is kept until.
type expiryEntry struct {
	jti   string
	until time.Time
}

// expiryHeap is a min-heap of entries by time (container/heap), so that
// dropping the expired ones costs only what is dropped.
type expiryHeap []expiryEntry

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].until.Before(h[j].until) }
func (h expiryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiryHeap) Push(x any)        { *h = append(*h, x.(expiryEntry)) }
func (h *expiryHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}
