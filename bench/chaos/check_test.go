package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/daemon/journal"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

func signedUpdate(t *testing.T, id, state string) []byte {
	t.Helper()
	body, err := proto.Marshal(&nodev1.UpdateBody{CommandId: id, State: state})
	if err != nil {
		t.Fatal(err)
	}
	u, err := proto.Marshal(&nodev1.CommandUpdate{Body: body})
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestJournalsCountRunsAcrossRestarts writes journals with bcd's own
// journal package: one command run once and finished, kept across a
// restart (whose compaction rewrites its entries); one begun again after
// the restart, which must count as run twice though each file alone
// holds its start once per run; and one finished after the restart, whose
// state comes from the newest file.
func TestJournalsCountRunsAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "journal.log")
	now := time.Now()
	exp := now.Add(time.Hour)
	j, err := journal.Open(path, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"once", "twice", "late"} {
		if err := j.StartCommand(id, exp, "diag.run", nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := j.Done("once", exp, signedUpdate(t, "once", "succeeded")); err != nil {
		t.Fatal(err)
	}
	// The harness's copy before the restart.
	seg := filepath.Join(dir, "seg.000.log")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(seg, b, 0o600); err != nil {
		t.Fatal(err)
	}
	j, err = journal.Open(path, now, time.Hour) // the restart compacts
	if err != nil {
		t.Fatal(err)
	}
	if err := j.StartCommand("twice", exp, "diag.run", nil); err != nil {
		t.Fatal(err)
	}
	if err := j.Done("late", exp, signedUpdate(t, "late", "failed")); err != nil {
		t.Fatal(err)
	}
	js := &journals{}
	got, err := js.node(&node{dataDir: dir, segments: []string{seg}})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]jcmd{
		"once":  {starts: 1, done: true, state: "succeeded"},
		"twice": {starts: 2},
		"late":  {starts: 1, done: true, state: "failed"},
	}
	for id, w := range want {
		g := got[id]
		if g == nil || *g != w {
			t.Errorf("%s: got %+v, want %+v", id, g, w)
		}
	}
}
