package daemon

import (
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/daemon/journal"
)

// TestOutboxSendsInOrderMade: the outbox hands out due results in the
// order they were made, not in map order, also after a requeue that
// merges the journal's unacknowledged results (in their journal order)
// with those already waiting. The control plane relies on it: a result
// it sees implies every earlier result of the node was offered first.
func TestOutboxSendsInOrderMade(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	o := newOutbox(time.Second)
	names := []string{"e", "c", "a", "d", "b", "f", "h", "g"}
	for _, id := range names {
		o.put(id, []byte(id))
	}
	got, _ := o.take(now)
	if s := joined(got); s != "ecadbfhg" {
		t.Fatalf("take: %s, want ecadbfhg", s)
	}
	// The journal lists x, e, a (x only in the journal, made before a
	// restart); the others follow in their own order.
	o.requeue([]journal.Record{{ID: "x", Update: []byte("x")}, {ID: "e", Update: []byte("e")}, {ID: "a", Update: []byte("a")}})
	got, _ = o.take(now)
	if s := joined(got); s != "xeacdbfhg" {
		t.Fatalf("after requeue: %s, want xeacdbfhg", s)
	}
}

func joined(b [][]byte) string {
	var s string
	for _, x := range b {
		s += string(x)
	}
	return s
}
