package daemon

import (
	"sort"
	"sync"
	"time"

	"github.com/bettercompute/bettercompute/internal/daemon/journal"
)

// MaxResendWait bounds the wait between two sends of one unacknowledged
// result on a session: the wait starts at Config.ResendAfter and doubles
// after each send up to this bound (or up to ResendAfter, if longer).
const MaxResendWait = 5 * time.Minute

// outbox holds the final updates the node journaled and the control plane
// has not acknowledged, each with the time it is due to be sent (again).
// It belongs to the node, not to a session: a worker hands a result here
// once it is journaled, and whichever session is live sends it (the one
// that delivered the command may have ended since); with no session live
// it waits for the next. A result sent and not acknowledged within its
// wait is sent again on the same session, with the wait doubling up to
// MaxResendWait, so a result the gateway refused without an ack (a
// database deadlock, a restart) comes back without a reconnect. The
// journal stays the durable record (Unacked refills the outbox at each
// session start); the outbox is the schedule.
type outbox struct {
	first, max time.Duration

	mu    sync.Mutex
	items map[string]*outItem
	seq   uint64        // the last outItem.seq given
	wake  chan struct{} // poked when an item is due at once
}

type outItem struct {
	update []byte        // the marshalled, signed CommandUpdate
	due    time.Time     // zero: due at once
	wait   time.Duration // how long to wait for the ack after the next send
	seq    uint64        // the order results are sent in: the order they were made
}

func newOutbox(first time.Duration) *outbox {
	return &outbox{first: first, max: max(first, MaxResendWait), items: map[string]*outItem{}, wake: make(chan struct{}, 1)}
}

// put makes id's final update due at once and wakes the live session.
func (o *outbox) put(id string, update []byte) {
	o.mu.Lock()
	o.seq++
	o.items[id] = &outItem{update: update, wait: o.first, seq: o.seq}
	o.mu.Unlock()
	o.poke()
}

func (o *outbox) poke() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// requeue, at the start of a session, makes every result not yet
// acknowledged due at once with a fresh wait: those already here and
// those the journal holds (made before a crash, say), the journal's in
// the order they were journaled (unacked is in that order) and ahead of
// any the journal does not list yet. It never drops an item, so a result
// a worker handed over meanwhile is kept.
func (o *outbox) requeue(unacked []journal.Record) {
	o.mu.Lock()
	defer o.mu.Unlock()
	rest := make([]*outItem, 0, len(o.items))
	for _, it := range o.items {
		it.due, it.wait = time.Time{}, o.first
		rest = append(rest, it)
	}
	sort.Slice(rest, func(a, b int) bool { return rest[a].seq < rest[b].seq })
	o.seq = 0
	listed := make(map[*outItem]bool, len(unacked))
	for _, r := range unacked {
		it := o.items[r.ID]
		if it == nil {
			it = &outItem{update: r.Update, wait: o.first}
			o.items[r.ID] = it
		}
		o.seq++
		it.seq = o.seq
		listed[it] = true
	}
	for _, it := range rest {
		if !listed[it] {
			o.seq++
			it.seq = o.seq
		}
	}
}

// ack forgets id: the control plane acknowledged its final update.
func (o *outbox) ack(id string) {
	o.mu.Lock()
	delete(o.items, id)
	o.mu.Unlock()
}

// take returns the updates due by now, oldest result first (the order
// they were made, see requeue), and schedules each to be due again after
// its wait, which it then doubles (up to the bound). It returns the
// earliest time an item falls due next (zero when nothing is pending).
func (o *outbox) take(now time.Time) (due [][]byte, next time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var items []*outItem
	for _, it := range o.items {
		if !it.due.After(now) {
			items = append(items, it)
			it.due = now.Add(it.wait)
			it.wait = min(it.wait*2, o.max)
		}
		if next.IsZero() || it.due.Before(next) {
			next = it.due
		}
	}
	sort.Slice(items, func(a, b int) bool { return items[a].seq < items[b].seq })
	for _, it := range items {
		due = append(due, it.update)
	}
	return due, next
}

// pending returns how many results await their ack.
func (o *outbox) pending() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.items)
}

// PendingResults returns how many final results await the control plane's
// ack (sent or not yet sent).
func (n *Node) PendingResults() int { return n.outbox.pending() }
