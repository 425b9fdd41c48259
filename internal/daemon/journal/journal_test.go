package journal

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestJournalReplay(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.log")
	now := time.Now()
	j, err := Open(path, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	exp := now.Add(time.Hour)
	must(t, j.Start("c-running", exp))
	must(t, j.Start("c-done", exp))
	must(t, j.Done("c-done", exp, []byte("u1")))
	must(t, j.Start("c-acked", exp))
	must(t, j.Done("c-acked", exp, []byte("u2")))
	must(t, j.Ack("c-acked"))
	must(t, j.Close())
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("journal mode %v (%v), want 0600", st.Mode().Perm(), err)
	}

	j, err = Open(path, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if got := j.Interrupted(); len(got) != 1 || got[0].ID != "c-running" {
		t.Fatalf("interrupted = %+v", got)
	}
	if got := j.Unacked(); len(got) != 1 || got[0].ID != "c-done" || string(got[0].Update) != "u1" {
		t.Fatalf("unacked = %+v", got)
	}
	for _, id := range []string{"c-running", "c-done", "c-acked"} {
		if !j.Seen(id) {
			t.Fatalf("%s not seen after replay", id)
		}
	}
	if j.Seen("c-new") {
		t.Fatal("unknown id seen")
	}
}

func TestJournalCompactsAckedExpired(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.log")
	now := time.Now()
	j, err := Open(path, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	old := now.Add(-3 * time.Hour)
	must(t, j.Start("old", old))
	must(t, j.Done("old", old, []byte("u")))
	must(t, j.Ack("old"))
	must(t, j.Start("old-unacked", old))
	must(t, j.Done("old-unacked", old, []byte("u")))
	must(t, j.Close())
	j, err = Open(path, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if j.Seen("old") {
		t.Fatal("acked command expired beyond keep was not compacted")
	}
	if !j.Seen("old-unacked") {
		t.Fatal("unacked command was compacted")
	}
}

func TestJournalTornTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal.log")
	now := time.Now()
	j, err := Open(path, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	must(t, j.Start("c1", now.Add(time.Hour)))
	must(t, j.Close())
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString(`{"op":"done","id":"c1","upd`)
	f.Close()
	j, err = Open(path, now, time.Hour)
	if err != nil {
		t.Fatalf("torn tail made the journal unreadable: %v", err)
	}
	defer j.Close()
	if got := j.Interrupted(); len(got) != 1 || got[0].ID != "c1" {
		t.Fatalf("interrupted = %+v, want c1 (its done line was torn)", got)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
