package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

func newTestDispatcher(q *fakeQueue) *dispatcher {
	return newDispatcher(q, slog.New(slog.DiscardHandler))
}

func idsOf(cmds []*nodev1.SignedCommand) []string {
	var out []string
	for _, c := range cmds {
		out = append(out, c.Id)
	}
	return out
}

// sendAll takes o's outbox and "sends" all of it, as deliver does.
func sendAll(d *dispatcher, o *outbox) []string {
	batch := d.take(o)
	for _, c := range batch {
		d.markSent("s1", c.Id)
	}
	return idsOf(batch)
}

// TestDispatchHandsEachCommandOnceInFlight: a wanted node's queued
// commands go to its outbox in order and wake it; while in flight (taken,
// not yet recorded sent) they are not handed out again; the next round
// records them sent in the queue.
func TestDispatchHandsEachCommandOnceInFlight(t *testing.T) {
	q := newFakeQueue()
	q.add("n1", "c1", "run")
	q.add("n1", "c2", "run")
	q.add("n2", "c3", "run")
	d := newTestDispatcher(q)
	o := newOutbox()
	d.attach("n1", o)
	d.wantNode("n1")
	ctx := context.Background()
	d.round(ctx, false)
	select {
	case <-o.wake:
	default:
		t.Fatal("outbox not woken")
	}
	batch := d.take(o)
	if got := idsOf(batch); !slices.Equal(got, []string{"c1", "c2"}) {
		t.Fatalf("handed %v, want c1 c2 (n2 has no session)", got)
	}
	// Taken, not sent yet: still queued in the database, still in flight.
	d.wantNode("n1")
	d.round(ctx, false)
	if got := idsOf(d.take(o)); len(got) != 0 {
		t.Fatalf("in-flight commands handed again: %v", got)
	}
	for _, c := range batch {
		d.markSent("s1", c.Id)
	}
	d.round(ctx, false)
	if q.state("c1") != wire.StateSent || q.state("c2") != wire.StateSent || q.state("c3") != wire.StateQueued {
		t.Fatalf("states %s %s %s", q.state("c1"), q.state("c2"), q.state("c3"))
	}
	if len(d.inflight) != 0 {
		t.Fatalf("still in flight after recording: %v", d.inflight)
	}
}

// TestDispatchDetachReturnsUntaken: what a session was handed and did not
// take goes back to the queue when it ends; the node's next session gets
// it. A superseded session's end does not remove its successor's outbox.
func TestDispatchDetachReturnsUntaken(t *testing.T) {
	q := newFakeQueue()
	q.add("n1", "c1", "run")
	d := newTestDispatcher(q)
	old := newOutbox()
	d.attach("n1", old)
	d.wantNode("n1")
	d.round(context.Background(), false)
	next := newOutbox()
	d.attach("n1", next) // a newer session supersedes old before old ends
	d.detach("n1", old)
	if d.outboxes["n1"] != next {
		t.Fatal("the old session's end removed the new session's outbox")
	}
	d.wantNode("n1")
	d.round(context.Background(), false)
	if got := sendAll(d, next); !slices.Equal(got, []string{"c1"}) {
		t.Fatalf("next session got %v, want c1", got)
	}
	d.detach("n1", next)
	if _, ok := d.outboxes["n1"]; ok {
		t.Fatal("outbox kept after its session ended")
	}
}

// TestDispatchReleaseAfterFailedSend: commands a session took but could
// not send are fetched again.
func TestDispatchReleaseAfterFailedSend(t *testing.T) {
	q := newFakeQueue()
	q.add("n1", "c1", "run")
	q.add("n1", "c2", "run")
	d := newTestDispatcher(q)
	o := newOutbox()
	d.attach("n1", o)
	d.wantNode("n1")
	d.round(context.Background(), false)
	batch := d.take(o)
	d.markSent("s1", batch[0].Id) // c1 went out, c2 did not
	d.release(batch[1:])
	d.wantNode("n1")
	d.round(context.Background(), false)
	if got := idsOf(d.take(o)); !slices.Equal(got, []string{"c2"}) {
		t.Fatalf("handed %v, want c2 again only", got)
	}
}

// TestDispatchMarkSentFailureRetries: a failed MarkSent keeps the ids in
// flight (never handed out again) and records them next round.
func TestDispatchMarkSentFailureRetries(t *testing.T) {
	q := newFakeQueue()
	q.add("n1", "c1", "run")
	d := newTestDispatcher(q)
	o := newOutbox()
	d.attach("n1", o)
	d.wantNode("n1")
	d.round(context.Background(), false)
	sendAll(d, o)
	q.failMark = 1
	d.wantNode("n1")
	d.round(context.Background(), false)
	if q.state("c1") != wire.StateQueued {
		t.Fatalf("state %s after a failed MarkSent", q.state("c1"))
	}
	if got := idsOf(d.take(o)); len(got) != 0 {
		t.Fatalf("a sent command was handed again: %v", got)
	}
	d.round(context.Background(), false)
	if q.state("c1") != wire.StateSent || !slices.Equal(d.sent, nil) {
		t.Fatalf("state %s, pending %v", q.state("c1"), d.sent)
	}
}

// TestDispatchReadFailureKeepsWanted: a failed read leaves the nodes
// wanted for the next round.
func TestDispatchReadFailureKeepsWanted(t *testing.T) {
	q := newFakeQueue()
	q.add("n1", "c1", "run")
	d := newTestDispatcher(q)
	o := newOutbox()
	d.attach("n1", o)
	d.wantNode("n1")
	q.failRead = 1
	d.round(context.Background(), false)
	if !d.want["n1"] {
		t.Fatal("node not wanted again after a failed read")
	}
	d.round(context.Background(), false)
	if got := idsOf(d.take(o)); !slices.Equal(got, []string{"c1"}) {
		t.Fatalf("handed %v", got)
	}
}

// TestDispatchBusyOutboxWaits: a node whose outbox still holds its last
// batch is not read for; it is wanted again next round.
func TestDispatchBusyOutboxWaits(t *testing.T) {
	q := newFakeQueue()
	q.add("n1", "c1", "run")
	d := newTestDispatcher(q)
	o := newOutbox()
	d.attach("n1", o)
	d.wantNode("n1")
	d.round(context.Background(), false)
	q.add("n1", "c2", "run")
	d.wantNode("n1")
	reads := len(q.reads)
	d.round(context.Background(), false)
	if len(q.reads) != reads || !d.want["n1"] {
		t.Fatalf("busy node read for (%d reads) or dropped (want %v)", len(q.reads)-reads, d.want)
	}
}

// TestDispatchAllReadsPendingNodes: a round for all reads every node with
// queued work that has a session, and only those, in one read; at most
// perNodeBatch per node.
func TestDispatchAllReadsPendingNodes(t *testing.T) {
	q := newFakeQueue()
	for i := range perNodeBatch + 3 {
		q.add("n1", fmt.Sprintf("a%03d", i), "run")
	}
	q.add("n2", "b1", "run")
	q.add("n3", "c1", "run") // no session here
	d := newTestDispatcher(q)
	o1, o2 := newOutbox(), newOutbox()
	d.attach("n1", o1)
	d.attach("n2", o2)
	d.round(context.Background(), true)
	if len(q.reads) != 1 || !slices.Equal(q.reads[0], []string{"n1", "n2"}) {
		t.Fatalf("reads %v", q.reads)
	}
	if got := sendAll(d, o1); len(got) != perNodeBatch || got[0] != "a000" {
		t.Fatalf("n1 handed %d (%v...)", len(got), got[:1])
	}
	if got := sendAll(d, o2); !slices.Equal(got, []string{"b1"}) {
		t.Fatalf("n2 handed %v", got)
	}
	d.wantNode("n1")
	d.round(context.Background(), false)
	if got := sendAll(d, o1); len(got) != 3 {
		t.Fatalf("n1's rest: %v", got)
	}
}

// TestDispatchRunRecordsOnStop: the loop records what was sent when it
// stops, so that the next gateway does not send it again.
func TestDispatchRunRecordsOnStop(t *testing.T) {
	q := newFakeQueue()
	q.add("n1", "c1", "run")
	d := newTestDispatcher(q)
	o := newOutbox()
	d.attach("n1", o)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.run(ctx, time.Hour, nil, nil); close(done) }()
	d.wantNode("n1")
	select {
	case <-o.wake:
	case <-time.After(10 * time.Second):
		t.Fatal("run did not hand the command")
	}
	sendAll(d, o)
	cancel()
	<-done
	if q.state("c1") != wire.StateSent {
		t.Fatalf("state %s after stop", q.state("c1"))
	}
}

// TestDispatchRunPollsWithoutWallTime: with no poke at all, every poll
// interval a round reads the nodes with work waiting and hands their
// commands over; a signal that a batch was signed starts such a round at
// once. The bubble's fake clock drives the ticker.
func TestDispatchRunPollsWithoutWallTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newFakeQueue()
		d := newTestDispatcher(q)
		o := newOutbox()
		d.attach("n1", o)
		signed := make(chan struct{}, 1)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go d.run(ctx, time.Second, signed, nil)
		q.add("n1", "c1", "run")
		time.Sleep(999 * time.Millisecond)
		synctest.Wait()
		if got := idsOf(d.take(o)); len(got) != 0 {
			t.Fatalf("handed %v before the poll", got)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if got := sendAll(d, o); !slices.Equal(got, []string{"c1"}) {
			t.Fatalf("poll handed %v", got)
		}
		q.add("n1", "c2", "run")
		signed <- struct{}{}
		synctest.Wait()
		if got := idsOf(d.take(o)); !slices.Equal(got, []string{"c2"}) {
			t.Fatalf("signal handed %v", got)
		}
		if q.state("c1") != wire.StateSent {
			t.Fatalf("c1 is %s after the next round", q.state("c1"))
		}
	})
}

// TestDispatchRequeuesWhatEndedSessionsSent replays issue 23 item 5 in
// the dispatcher: a session sent c1 and ended before the node reported
// anything; the next round records c1 sent on that session, then puts it
// back in the queue and hands it to the node's next session in the same
// round. A command the node reported on (c2) stays as it is.
func TestDispatchRequeuesWhatEndedSessionsSent(t *testing.T) {
	q := newFakeQueue()
	q.add("n1", "c1", "run")
	q.add("n1", "c2", "run")
	d := newTestDispatcher(q)
	ctx := context.Background()
	old := newOutbox()
	d.attach("n1", old)
	d.wantNode("n1")
	d.round(ctx, false)
	for _, c := range d.take(old) {
		d.markSent("s-old", c.Id)
	}
	d.round(ctx, false)
	if q.session("c1") != "s-old" || q.session("c2") != "s-old" {
		t.Fatalf("sent on %q and %q, want s-old", q.session("c1"), q.session("c2"))
	}
	q.ApplyUpdates(ctx, []wire.UpdateItem{{NodeID: "n1", Update: &nodev1.CommandUpdate{Body: []byte("c2")}}})
	next := newOutbox()
	d.attach("n1", next)
	d.detach("n1", old)
	d.sessionEnded("n1", "s-old")
	d.round(ctx, false)
	if got := idsOf(d.take(next)); !slices.Equal(got, []string{"c1"}) {
		t.Fatalf("next session got %v, want c1", got)
	}
	if q.state("c1") != wire.StateQueued || q.state("c2") != wire.StateSucceeded {
		t.Fatalf("states %s %s, want queued succeeded", q.state("c1"), q.state("c2"))
	}
}

// TestDispatchRequeueWaitsForSends: a session's last sends and its end
// reach the same round; when recording the sends fails, the end waits
// too (requeueing first would leave the late-recorded command sent on a
// dead session), and both go through next round. A failed requeue is
// tried again next round.
func TestDispatchRequeueWaitsForSends(t *testing.T) {
	q := newFakeQueue()
	q.add("n1", "c1", "run")
	d := newTestDispatcher(q)
	ctx := context.Background()
	o := newOutbox()
	d.attach("n1", o)
	d.wantNode("n1")
	d.round(ctx, false)
	for _, c := range d.take(o) {
		d.markSent("s1", c.Id)
	}
	d.detach("n1", o)
	d.sessionEnded("n1", "s1")
	q.failMark, q.failRequeue = 1, 1
	d.round(ctx, false)
	if q.state("c1") != wire.StateQueued || !d.inflight["c1"] {
		t.Fatalf("after a failed MarkSent: %s, in flight %v", q.state("c1"), d.inflight["c1"])
	}
	d.round(ctx, false) // records c1 sent on s1; the requeue fails
	if q.state("c1") != wire.StateSent || q.session("c1") != "s1" {
		t.Fatalf("after a failed requeue: %s on %q, want sent on s1", q.state("c1"), q.session("c1"))
	}
	d.round(ctx, false)
	if q.state("c1") != wire.StateQueued || len(d.ended) != 0 {
		t.Fatalf("after the retry: %s, ends left %v", q.state("c1"), d.ended)
	}
}
