package daemon

import (
	"context"
	"sync"
	"testing"

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
