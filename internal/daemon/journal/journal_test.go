package journal

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestJournalReplay(t *testing.T) {
	path, now, j := openTemp(t)
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
	// The compaction replaced the file atomically: 0600, no temp file left.
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("compacted journal mode %v (%v), want 0600", st.Mode().Perm(), err)
	}
	if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
		t.Fatalf("directory holds %v after compaction, want only the journal", entries)
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
	// The torn bytes do not spoil what is written after them: an entry
	// appended now is read back after the next restart.
	must(t, j.Start("c2", now.Add(time.Hour)))
	must(t, j.Done("c2", now.Add(time.Hour), []byte("u2")))
	j2, err := Open(path, now, time.Hour)
	if err != nil {
		t.Fatalf("journal unreadable after appending past a torn tail: %v", err)
	}
	defer j2.Close()
	if got := j2.Unacked(); len(got) != 1 || got[0].ID != "c2" || string(got[0].Update) != "u2" {
		t.Fatalf("unacked after appending past a torn tail = %+v, want c2", got)
	}
	if got := j2.Interrupted(); len(got) != 1 || got[0].ID != "c1" {
		t.Fatalf("interrupted after appending past a torn tail = %+v, want c1", got)
	}
}

// TestJournalAckWrittenWithoutSync checks that the ack, though not
// fsynced, is appended to the file at once and read back after a reopen:
// the acknowledged command is not sent again, and stays seen.
func TestJournalAckWrittenWithoutSync(t *testing.T) {
	path, now, j := openTemp(t)
	exp := now.Add(time.Hour)
	must(t, j.Start("c1", exp))
	must(t, j.Done("c1", exp, []byte("u1")))
	must(t, j.Start("c2", exp))
	must(t, j.Done("c2", exp, []byte("u2")))
	must(t, j.Ack("c1"))
	must(t, j.Ack("c1"))      // a second ack of the same id writes nothing
	must(t, j.Ack("unknown")) // nor does an ack of an id never journaled
	if got := j.Unacked(); len(got) != 1 || got[0].ID != "c2" {
		t.Fatalf("unacked before reopen = %+v, want c2", got)
	}
	must(t, j.Close())
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(string(raw), `{"op":"ack","id":"c1"}`+"\n"); got != 1 {
		t.Fatalf("file holds %d ack lines for c1, want 1:\n%s", got, raw)
	}
	if strings.Contains(string(raw), "unknown") {
		t.Fatalf("an ack of an unknown id was written:\n%s", raw)
	}

	j, err = Open(path, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if got := j.Unacked(); len(got) != 1 || got[0].ID != "c2" || string(got[0].Update) != "u2" {
		t.Fatalf("unacked after reopen = %+v, want only c2", got)
	}
	if !j.Seen("c1") || j.Seen("unknown") {
		t.Fatal("acked command not seen after reopen, or unknown id seen")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// openTemp opens a new journal in a temporary directory.
func openTemp(t *testing.T) (string, time.Time, *Journal) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "journal.log")
	now := time.Now()
	j, err := Open(path, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return path, now, j
}

// TestJournalKeepsStartedCommand: the kind and payload digest a start
// entry records survive a reopen, and the compaction a reopen makes, so
// the update signed for an interrupted command still names what ran.
func TestJournalKeepsStartedCommand(t *testing.T) {
	path, now, j := openTemp(t)
	sum := []byte("0123456789abcdef0123456789abcdef")
	must(t, j.StartCommand("c-running", now.Add(time.Hour), "diag.run", sum))
	must(t, j.Close())
	for range 2 { // the second Open reads the compacted file
		var err error
		j, err = Open(path, now, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		got := j.Interrupted()
		if len(got) != 1 || got[0].Kind != "diag.run" || string(got[0].PayloadSHA256) != string(sum) {
			t.Fatalf("interrupted = %+v", got)
		}
		must(t, j.Close())
	}
}

// TestBeginClaimsOnce checks that Begin and Refuse journal an id only if
// it was never journaled: of many callers racing with one id exactly one
// starts it, a refusal after that neither journals nor replaces anything,
// and a start after a refusal is refused too; what they journaled
// survives a reopen.
func TestBeginClaimsOnce(t *testing.T) {
	path, now, j := openTemp(t)
	exp := now.Add(time.Hour)
	const callers = 16
	wins := make(chan bool, callers)
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := j.Begin("c-race", exp, "diag.run", nil)
			if err != nil {
				t.Error(err)
			}
			wins <- ok
		}()
	}
	wg.Wait()
	close(wins)
	won := 0
	for ok := range wins {
		if ok {
			won++
		}
	}
	if won != 1 {
		t.Fatalf("%d of %d racing Begin calls started c-race, want 1", won, callers)
	}
	if ok, err := j.Refuse("c-race", exp, []byte("cancelled")); ok || err != nil {
		t.Fatalf("Refuse of a started id = %v, %v; want false", ok, err)
	}
	if ok, err := j.Refuse("c-refused", exp, []byte("cancelled")); !ok || err != nil {
		t.Fatalf("Refuse of a new id = %v, %v; want true", ok, err)
	}
	if ok, err := j.Begin("c-refused", exp, "diag.run", nil); ok || err != nil {
		t.Fatalf("Begin of a refused id = %v, %v; want false", ok, err)
	}
	j, err := Open(path, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if got := j.Interrupted(); len(got) != 1 || got[0].ID != "c-race" {
		t.Fatalf("interrupted = %+v, want c-race started and not done", got)
	}
	if u, ok := j.Final("c-refused"); !ok || string(u) != "cancelled" {
		t.Fatalf("final of c-refused = %q, %v", u, ok)
	}
}

// TestUnackedInOrderFinished: Unacked lists finished results in the order
// they were journaled, not by id, and keeps that order across a reopen
// (which compacts the file).
func TestUnackedInOrderFinished(t *testing.T) {
	path, now, j := openTemp(t)
	exp := now.Add(time.Hour)
	order := []string{"c9", "c1", "c5", "c3"}
	for _, id := range order {
		must(t, j.Start(id, exp))
	}
	for _, id := range order {
		must(t, j.Done(id, exp, []byte(id)))
	}
	check := func(j *Journal, when string) {
		t.Helper()
		var got []string
		for _, r := range j.Unacked() {
			got = append(got, r.ID)
		}
		if strings.Join(got, ",") != strings.Join(order, ",") {
			t.Fatalf("%s: unacked %v, want %v", when, got, order)
		}
	}
	check(j, "open")
	for i := 0; i < 2; i++ {
		j2, err := Open(path, now, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		check(j2, "reopened")
	}
}
