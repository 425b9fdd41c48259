package gateway

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// perNodeBatch bounds how many commands dispatch hands one session per
// round; a session that sends a full batch asks for the next.
const perNodeBatch = 64

// outbox is one session's queue of commands the dispatcher handed it and
// its deliver loop has not taken yet.
type outbox struct {
	cmds []*nodev1.SignedCommand // guarded by dispatcher.mu
	wake chan struct{}           // wakes the session's deliver loop; coalesced
}

func newOutbox() *outbox { return &outbox{wake: make(chan struct{}, 1)} }

// poke wakes the outbox's deliver loop without blocking.
func (o *outbox) poke() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// dispatcher moves signed commands from the command queue to the
// sessions' outboxes, for the whole gateway at once. It owns the delivery
// state: the outbox of each node's current session, the commands in
// flight (handed to a session and not yet recorded as sent), the ids
// sessions sent since the last round, and the nodes wanted next round.
//
// Each round first records in one call what the sessions sent since the
// last round, then fetches in one call the queued commands of the nodes
// that asked (a new session, a poke) or, when all, of every node with work
// waiting, and puts them in the outboxes. A command is in flight from the
// moment it is handed to a session until its sent state is recorded, and
// is never handed out twice meanwhile; because recording comes before
// fetching in the same goroutine, a fetch never sees a command as queued
// that a session already sent and the dispatcher already forgot. That
// holds within one gateway: a node that moves to another gateway before
// its last commands were recorded as sent (one round) gets them again
// there, and answers the copies as replays with the results it journaled,
// which changes nothing.
//
// A command is recorded sent with the session it was written to. When a
// session's deliver loop has returned (ended), the next round, after
// recording what that session sent, puts the commands still sent on it
// (the node reported nothing on them, so it may never have read them)
// back in the queue and fetches for the node again: its next session gets
// them. Because a deliver loop reports its end after its last send, and a
// round takes the sends and the ends under one lock, an ended session's
// sends are always recorded before it is requeued; and the session can no
// longer send, so a requeued command is never in two live sessions of
// this gateway at once.
type dispatcher struct {
	cmds Commands
	log  *slog.Logger

	mu       sync.Mutex
	outboxes map[string]*outbox // by node id: its current session's
	inflight map[string]bool    // command ids handed to a session and not yet recorded as sent
	sent     []wire.Sent        // what sessions sent since the last round recorded it
	ended    []endedSession     // sessions whose deliver loop returned, not yet requeued
	want     map[string]bool    // nodes to fetch commands for next round

	poke chan struct{} // wakes run; coalesced
}

// endedSession is a session of nodeID that will send nothing more.
type endedSession struct{ nodeID, sessionID string }

func newDispatcher(cmds Commands, log *slog.Logger) *dispatcher {
	return &dispatcher{cmds: cmds, log: log, outboxes: map[string]*outbox{}, inflight: map[string]bool{},
		want: map[string]bool{}, poke: make(chan struct{}, 1)}
}

// attach makes o the outbox of nodeID's current session.
func (d *dispatcher) attach(nodeID string, o *outbox) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.outboxes[nodeID] = o
}

// detach ends o, the outbox of a session of nodeID that ended: what was
// handed to it and not taken goes back to the queue (still queued in the
// database, fetched again for the node's next session).
func (d *dispatcher) detach(nodeID string, o *outbox) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.outboxes[nodeID] == o {
		delete(d.outboxes, nodeID)
	}
	for _, c := range o.cmds {
		delete(d.inflight, c.Id)
	}
	o.cmds = nil
}

// take returns what was handed to o since the last take.
func (d *dispatcher) take(o *outbox) []*nodev1.SignedCommand {
	d.mu.Lock()
	defer d.mu.Unlock()
	batch := o.cmds
	o.cmds = nil
	return batch
}

// markSent notes that session sessionID sent command id; the next round
// records it.
func (d *dispatcher) markSent(sessionID, id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.sent = append(d.sent, wire.Sent{CommandID: id, SessionID: sessionID})
}

// sessionEnded notes that session sessionID of nodeID sends nothing more (its
// deliver loop returned, after its last markSent); the next round puts
// what it sent and the node did not report on back in the queue.
func (d *dispatcher) sessionEnded(nodeID, sessionID string) {
	d.mu.Lock()
	d.ended = append(d.ended, endedSession{nodeID: nodeID, sessionID: sessionID})
	d.mu.Unlock()
	d.wakeUp()
}

// release returns commands a session took but could not send to the queue
// (they stay queued in the database; a later round fetches them again).
func (d *dispatcher) release(cmds []*nodev1.SignedCommand) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range cmds {
		delete(d.inflight, c.Id)
	}
}

// wantNode asks the next round to fetch nodeID's queued commands.
func (d *dispatcher) wantNode(nodeID string) {
	d.mu.Lock()
	d.want[nodeID] = true
	d.mu.Unlock()
	d.wakeUp()
}

// wakeUp starts a round soon without blocking.
func (d *dispatcher) wakeUp() {
	select {
	case d.poke <- struct{}{}:
	default:
	}
}

// run does a round every poll and on each signal from local or remote (a
// batch was signed in this process or another: of every node with work),
// and on each wakeUp (of the wanted nodes), until ctx ends; it then
// records what was sent before the stop, so that the next gateway does not
// send it again.
func (d *dispatcher) run(ctx context.Context, poll time.Duration, local, remote <-chan struct{}) {
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		all := false
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			d.recordSent(fctx)
			cancel()
			return
		case <-t.C:
			all = true
		case <-local:
			all = true
		case <-remote:
			all = true
		case <-d.poke:
		}
		d.round(ctx, all)
	}
}

// round records what was sent, then fetches for the wanted nodes (every
// node with work, when all).
func (d *dispatcher) round(ctx context.Context, all bool) {
	d.recordSent(ctx)
	d.fetch(ctx, all)
}

// recordSent marks what the sessions sent, then requeues what the ended
// sessions sent and the node did not report on. The sends and the ends
// are taken together, so every send of an ended session is recorded
// before its requeue. On failure the ids stay in flight, and the ends
// wait, for the next round.
func (d *dispatcher) recordSent(ctx context.Context) {
	d.mu.Lock()
	sent, ended := d.sent, d.ended
	d.sent, d.ended = nil, nil
	d.mu.Unlock()
	if len(sent) > 0 {
		if err := d.cmds.MarkSent(ctx, sent); err != nil {
			if ctx.Err() == nil {
				d.log.Error("mark commands sent", "count", len(sent), "err", err)
			}
			d.mu.Lock()
			d.sent = append(sent, d.sent...)
			d.ended = append(ended, d.ended...)
			d.mu.Unlock()
			return
		}
		d.mu.Lock()
		for _, c := range sent {
			delete(d.inflight, c.CommandID)
		}
		d.mu.Unlock()
	}
	d.requeue(ctx, ended)
}

// requeue puts what the ended sessions sent and their nodes did not
// report on back in the queue, and asks the next fetch for those nodes
// (a node's new session on this gateway gets them at once); on failure
// the ends wait for the next round.
func (d *dispatcher) requeue(ctx context.Context, ended []endedSession) {
	if len(ended) == 0 {
		return
	}
	sessions := make([]string, len(ended))
	for i, e := range ended {
		sessions[i] = e.sessionID
	}
	n, err := d.cmds.RequeueEnded(ctx, sessions)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			d.log.Error("requeue commands of ended sessions", "sessions", len(sessions), "err", err)
		}
		d.ended = append(ended, d.ended...)
		return
	}
	if n > 0 {
		d.log.Info("requeued commands of ended sessions", "sessions", len(sessions), "count", n)
		for _, e := range ended {
			d.want[e.nodeID] = true
		}
	}
}

// fetch hands queued commands to the outboxes of the wanted nodes (and,
// when all, of every node with work waiting) whose outbox is empty.
func (d *dispatcher) fetch(ctx context.Context, all bool) {
	d.mu.Lock()
	want := d.want
	d.want = map[string]bool{}
	d.mu.Unlock()
	if all {
		ids, err := d.cmds.PendingNodes(ctx)
		if err != nil && ctx.Err() == nil {
			d.log.Error("read nodes with pending commands", "err", err)
		}
		for _, id := range ids {
			want[id] = true
		}
	}
	nodes := d.ready(want)
	if len(nodes) == 0 {
		return
	}
	pending, err := d.cmds.PendingFor(ctx, nodes, perNodeBatch)
	if err != nil {
		if ctx.Err() == nil {
			d.log.Error("read pending commands", "nodes", len(nodes), "err", err)
		}
		d.mu.Lock()
		for _, id := range nodes {
			d.want[id] = true
		}
		d.mu.Unlock()
		return
	}
	d.hand(pending)
}

// ready returns the nodes of want that have a session with an empty
// outbox; one still sending its last batch is wanted again next round.
func (d *dispatcher) ready(want map[string]bool) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var nodes []string
	for id := range want {
		switch o := d.outboxes[id]; {
		case o == nil:
		case len(o.cmds) == 0:
			nodes = append(nodes, id)
		default:
			d.want[id] = true
		}
	}
	return nodes
}

// hand puts each node's pending commands that are not in flight into its
// current session's outbox and wakes it.
func (d *dispatcher) hand(pending map[string][]*nodev1.SignedCommand) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for nodeID, cmds := range pending {
		o := d.outboxes[nodeID] // an outbox in the map has not ended
		if o == nil {
			continue
		}
		added := false
		for _, c := range cmds {
			if d.inflight[c.Id] {
				continue
			}
			d.inflight[c.Id] = true
			o.cmds = append(o.cmds, c)
			added = true
		}
		if added {
			o.poke()
		}
	}
}
