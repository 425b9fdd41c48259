package daemon

import (
	"context"
	"sync"
	"time"

	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// HelperEventSource drains the root helper's events (bcd helper's
// events.drain): each call returns and forgets what the helper logged
// since the last, and how many events it dropped.
type HelperEventSource func(ctx context.Context) (events []helperwire.Event, dropped int, err error)

// DefaultHelperPoll is Config.HelperPoll when it is zero.
const DefaultHelperPoll = 5 * time.Second

// maxPendingHelperEvents bounds what the node holds for the control
// plane; beyond it, events are counted as dropped.
const maxPendingHelperEvents = 4096

// helperEvents holds the helper's events not yet acknowledged by the
// control plane. One batch (at most nodes.MaxHelperEvents, 256) is in
// flight at a time, numbered by seq; its ack removes it and the next goes.
// They live in memory only: the helper's own log is the durable record.
type helperEvents struct {
	mu       sync.Mutex
	pending  []*nodev1.HelperEvent
	dropped  uint32
	seq      uint64
	inFlight int // events of pending[:inFlight] sent as seq, awaiting the ack
	wake     chan struct{}
}

func newHelperEvents() *helperEvents { return &helperEvents{wake: make(chan struct{}, 1)} }

// add queues events drained from the helper and wakes the session.
func (h *helperEvents) add(evs []helperwire.Event, dropped int) {
	h.mu.Lock()
	for _, e := range evs {
		if len(h.pending) >= maxPendingHelperEvents {
			h.dropped++
			continue
		}
		h.pending = append(h.pending, &nodev1.HelperEvent{AtMs: e.AtMs, Pid: e.PID, Uid: e.UID, Op: e.Op, Code: e.Code, Reason: e.Reason})
	}
	h.dropped += uint32(dropped)
	h.mu.Unlock()
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// next returns the batch to send, or nil when one is in flight (and
// fresh is false) or there is nothing to send. A fresh session resends
// the batch in flight under a new seq.
func (h *helperEvents) next(fresh bool) *nodev1.HelperEvents {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.inFlight > 0 && !fresh {
		return nil
	}
	if len(h.pending) == 0 && h.dropped == 0 {
		h.inFlight = 0
		return nil
	}
	n := min(len(h.pending), 256)
	h.seq++
	h.inFlight = max(n, 1)
	return &nodev1.HelperEvents{Seq: h.seq, Events: h.pending[:n:n], Dropped: h.dropped}
}

// ack forgets the batch in flight when seq names it.
func (h *helperEvents) ack(seq uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if seq != h.seq || h.inFlight == 0 {
		return false
	}
	h.pending = h.pending[min(h.inFlight, len(h.pending)):]
	h.dropped, h.inFlight = 0, 0
	return true
}

// pollHelper drains the helper every interval, by the node's clock, until
// ctx ends. A failed drain is logged and tried again next time: the
// helper keeps its events (bounded) until a drain succeeds.
func (n *Node) pollHelper(ctx context.Context, src HelperEventSource, every time.Duration) {
	for {
		evs, dropped, err := src(ctx)
		if err != nil && ctx.Err() == nil {
			n.cfg.Log.Warn("drain helper events", "err", err)
		} else if len(evs) > 0 || dropped > 0 {
			n.hev.add(evs, dropped)
		}
		t := n.cfg.Clock.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

// sendHelperEvents sends the next batch of helper events, if any.
func (n *Node) sendHelperEvents(send func(*nodev1.NodeMessage) error, fresh bool) error {
	m := n.hev.next(fresh)
	if m == nil {
		return nil
	}
	return send(&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_HelperEvents{HelperEvents: m}})
}

// PendingHelperEvents returns how many helper events await their ack.
func (n *Node) PendingHelperEvents() int {
	n.hev.mu.Lock()
	defer n.hev.mu.Unlock()
	return len(n.hev.pending)
}
