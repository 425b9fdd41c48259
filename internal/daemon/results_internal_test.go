package daemon

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// TestRacingCopiesRunOnce checks that two deliveries of one command that
// reach two workers at once (the old session's and the new one's) run it
// once: both workers are held right after their replay check, which both
// pass, and only one of them may then journal the start and run it; the
// other answers as to a replay.
func TestRacingCopiesRunOnce(t *testing.T) {
	f := newFixture(t)
	n, sim, _ := openTestNode(t, f, -1)
	var mu sync.Mutex
	arrived, both := 0, make(chan struct{})
	seen := n.seen
	n.seen = func(id string) bool {
		s := seen(id)
		mu.Lock()
		arrived++
		if arrived == 2 {
			close(both)
		}
		mu.Unlock()
		<-both
		return s
	}
	c := command(f, "c-twice", kinds.DiagRun, nil)
	var wg sync.WaitGroup
	for range 2 {
		work := make(chan *nodev1.SignedCommand, 1)
		work <- c
		close(work)
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.execute(context.Background(), work, func(*nodev1.NodeMessage) error { return nil }, nil, false, noSecrets)
		}()
	}
	wg.Wait()
	if runs := sim.Runs(kinds.DiagRun); runs != 1 {
		t.Fatalf("diag.run ran %d times, want once", runs)
	}
	if got := n.Refusals()[ReasonReplayed]; got != 1 {
		t.Fatalf("replayed refusals = %d, want 1 (the second copy)", got)
	}
}

// TestReplayAnswerSentUntilAcked checks that the answer to a replayed copy
// of a finished command (the result journaled the first time) goes to
// the outbox, which sends it again until the control plane acknowledges
// it: sent once, an answer the gateway could not record was lost and the
// command stayed "sent" for good.
func TestReplayAnswerSentUntilAcked(t *testing.T) {
	f := newFixture(t)
	n, sim, _ := openTestNode(t, f, -1)
	c := command(f, "c-replayed", kinds.DiagRun, nil)
	run := func() {
		work := make(chan *nodev1.SignedCommand, 1)
		work <- c
		close(work)
		n.execute(context.Background(), work, func(*nodev1.NodeMessage) error { return nil }, nil, false, noSecrets)
	}
	run()
	first, ok := n.journal.Final(c.Id)
	if !ok || n.outbox.pending() != 1 {
		t.Fatalf("first run: final journaled %v, %d results pending; want journaled, 1", ok, n.outbox.pending())
	}
	n.outbox.ack(c.Id)
	run()
	if runs := sim.Runs(kinds.DiagRun); runs != 1 {
		t.Fatalf("diag.run ran %d times, want once", runs)
	}
	due, _ := n.outbox.take(time.Now())
	if len(due) != 1 || !bytes.Equal(due[0], first) {
		t.Fatalf("after the replay the outbox holds %d results, want the first run's result once", len(due))
	}
}
