package chainlog

import (
	"os"
	"path/filepath"
	"testing"
)

// TestFailedWriteStopsAppends: after a write fails, what is on disk is
// unknown, so the Log refuses every later Append even once writes work.
func TestFailedWriteStopsAppends(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, _ := openLog(t, path)
	if _, err := l.Append(Event{Kind: "pair"}); err != nil {
		t.Fatal(err)
	}
	good := l.f
	ro, err := os.Open(path) // a descriptor that cannot write
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	l.mu.Lock()
	l.f = ro
	l.mu.Unlock()
	if _, err := l.Append(Event{Kind: "accept"}); err == nil {
		t.Fatal("Append through a read-only descriptor succeeded")
	}
	l.mu.Lock()
	l.f = good
	l.mu.Unlock()
	_, err = l.Append(Event{Kind: "accept"})
	wantRefused(t, err, ReasonFailed)
	if n, err := VerifyFile(path); n != 1 || err != nil {
		t.Fatalf("VerifyFile = %d, %v", n, err)
	}
}
