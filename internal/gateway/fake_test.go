package gateway

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// fakeQueue is an in-memory command queue with the behaviour the gateway
// relies on from Commands: commands are queued per node in order, sent
// once MarkSent records them (on the session that sent them), back in the
// queue when that session ended or was superseded before an update,
// acknowledged by updates, and cancelled when their kind is not allowed.
// Failures can be injected per call.
type fakeQueue struct {
	mu          sync.Mutex
	cmds        []*fakeCmd
	failMark    int // the next failMark MarkSent calls fail
	failRead    int // the next failRead PendingFor calls fail
	failRequeue int // the next failRequeue RequeueEnded calls fail
	marks       int // MarkSent calls that succeeded
	reads       [][]string
}

type fakeCmd struct {
	id, node, kind string
	state          wire.State
	session        string // the session it was sent on, while sent
}

var errInjected = errors.New("injected failure")

func newFakeQueue() *fakeQueue { return &fakeQueue{} }

// add queues a command of kind for node.
func (q *fakeQueue) add(node, id, kind string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.cmds = append(q.cmds, &fakeCmd{id: id, node: node, kind: kind, state: wire.StateQueued})
}

// state returns command id's state ("" when unknown).
func (q *fakeQueue) state(id string) wire.State {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, c := range q.cmds {
		if c.id == id {
			return c.state
		}
	}
	return ""
}

func (q *fakeQueue) PendingFor(_ context.Context, nodeIDs []string, perNode int) (map[string][]*nodev1.SignedCommand, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.reads = append(q.reads, slices.Sorted(slices.Values(nodeIDs)))
	if q.failRead > 0 {
		q.failRead--
		return nil, errInjected
	}
	out := map[string][]*nodev1.SignedCommand{}
	for _, c := range q.cmds {
		if c.state == wire.StateQueued && slices.Contains(nodeIDs, c.node) && len(out[c.node]) < perNode {
			out[c.node] = append(out[c.node], &nodev1.SignedCommand{Id: c.id, Body: []byte(c.kind)})
		}
	}
	return out, nil
}

// session returns the session command id is recorded sent on.
func (q *fakeQueue) session(id string) string {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, c := range q.cmds {
		if c.id == id {
			return c.session
		}
	}
	return ""
}

func (q *fakeQueue) MarkSent(_ context.Context, sent []wire.Sent) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.failMark > 0 {
		q.failMark--
		return errInjected
	}
	q.marks++
	for _, s := range sent {
		for _, c := range q.cmds {
			if c.state == wire.StateQueued && c.id == s.CommandID {
				c.state, c.session = wire.StateSent, s.SessionID
			}
		}
	}
	return nil
}

func (q *fakeQueue) RequeueEnded(_ context.Context, sessionIDs []string) (int64, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.failRequeue > 0 {
		q.failRequeue--
		return 0, errInjected
	}
	return q.requeue(func(c *fakeCmd) bool { return slices.Contains(sessionIDs, c.session) }), nil
}

func (q *fakeQueue) RequeueNode(_ context.Context, nodeID, sessionID string) (int64, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.requeue(func(c *fakeCmd) bool { return c.node == nodeID && c.session != sessionID }), nil
}

// requeue moves the sent commands that match back to queued.
func (q *fakeQueue) requeue(match func(*fakeCmd) bool) int64 {
	var n int64
	for _, c := range q.cmds {
		if c.state == wire.StateSent && match(c) {
			c.state = wire.StateQueued // keeps the session it was sent on, as the queue does
			n++
		}
	}
	return n
}

// ApplyUpdates takes an update's body as the id of the command it
// finishes: a live command of the node (its sent state may not be
// recorded yet) succeeds; any other is refused.
func (q *fakeQueue) ApplyUpdates(_ context.Context, items []wire.UpdateItem) []wire.UpdateResult {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make([]wire.UpdateResult, len(items))
	for i, it := range items {
		id := string(it.Update.GetBody())
		out[i] = wire.UpdateResult{CommandID: id, Err: errors.New("unknown command")}
		for _, c := range q.cmds {
			if c.id == id && c.node == it.NodeID && !c.state.Terminal() {
				c.state = wire.StateSucceeded
				out[i] = wire.UpdateResult{CommandID: id, State: string(c.state)}
			}
		}
	}
	return out
}

func (q *fakeQueue) CancelDisallowed(_ context.Context, nodeID, _ string, allowed []string) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if allowed == nil {
		return 0, nil
	}
	n := 0
	for _, c := range q.cmds {
		if c.node == nodeID && c.state == wire.StateQueued && !slices.Contains(allowed, c.kind) {
			c.state = wire.StateCancelled
			n++
		}
	}
	return n, nil
}

func (q *fakeQueue) PendingNodes(context.Context) ([]string, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []string
	for _, c := range q.cmds {
		if c.state == wire.StateQueued && !slices.Contains(out, c.node) {
			out = append(out, c.node)
		}
	}
	return out, nil
}
