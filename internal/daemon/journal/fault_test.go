package journal_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/daemon/journal"
	"github.com/bettercompute/bettercompute/internal/testenv/tmpfs"
)

// TestWriteAfterFullDiskSurvivesReopen runs the journal on a real tmpfs
// that the test fills (ENOSPC from the kernel). A "done" entry too big for
// the room left is written in part and refused; it is kept in memory
// (ErrNotDurable, wrapping ENOSPC). A "start" that cannot be written is
// refused and journals nothing. Once space returns, the next entry is
// written after the file is rewritten from memory, so reopening the
// journal finds every entry, the kept one too: appending after the
// partial line would have hidden everything after it from the loader.
func TestWriteAfterFullDiskSurvivesReopen(t *testing.T) {
	dir := tmpfs.Mount(t, 1<<20)
	path := filepath.Join(dir, "journal.log")
	now := time.Now()
	exp := now.Add(time.Hour)
	j, err := journal.Open(path, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.Begin("c-first", exp, "diag.run", nil); err != nil {
		t.Fatal(err)
	}
	filler := tmpfs.Fill(t, dir)

	// Larger than a page, so the write cannot fit in the journal's last
	// page: part of it is written, then ENOSPC.
	big := bytes.Repeat([]byte("u"), 3*4096)
	err = j.Done("c-first", exp, big)
	if !errors.Is(err, journal.ErrNotDurable) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Done on a full disk: %v, want ErrNotDurable wrapping ENOSPC", err)
	}
	if u, ok := j.Final("c-first"); !ok || !bytes.Equal(u, big) {
		t.Fatal("the kept result is not answered from memory")
	}
	if fresh, err := j.Begin("c-second", exp, "diag.run", nil); fresh || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Begin on a full disk: %v %v, want false and ENOSPC", fresh, err)
	}
	if j.Seen("c-second") {
		t.Fatal("a start that failed counts as seen")
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if fresh, err := j.Begin("c-third", exp, "diag.run", nil); !fresh || err != nil {
		t.Fatalf("Begin once space returned: %v %v", fresh, err)
	}

	j2, err := journal.Open(path, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if u, ok := j2.Final("c-first"); !ok || !bytes.Equal(u, big) {
		t.Fatal("after reopening, the result kept through the full disk is gone")
	}
	if !j2.Seen("c-third") {
		t.Fatal("after reopening, the start written once space returned is gone")
	}
	if j2.Seen("c-second") {
		t.Fatal("after reopening, the refused start is there")
	}
}

// TestOpenReadOnlyJournal: a journal on a folder that was made read-only
// opens (its compaction is skipped and reported), so a node can still
// send the results it holds; writes fail with EROFS, a refusal is kept in
// memory, and once the folder is writable again the next write makes the
// file whole.
func TestOpenReadOnlyJournal(t *testing.T) {
	dir := tmpfs.Mount(t, 1<<20)
	path := filepath.Join(dir, "journal.log")
	now := time.Now()
	exp := now.Add(time.Hour)
	j, err := journal.Open(path, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.Begin("c-done", exp, "diag.run", nil); err != nil {
		t.Fatal(err)
	}
	if err := j.Done("c-done", exp, []byte("u1")); err != nil {
		t.Fatal(err)
	}
	tmpfs.ReadOnly(t, dir)
	j2, err := journal.Open(path, now, time.Hour)
	if err != nil {
		t.Fatalf("open a read-only journal: %v", err)
	}
	if !errors.Is(j2.CompactErr(), syscall.EROFS) {
		t.Fatalf("CompactErr %v, want EROFS", j2.CompactErr())
	}
	if un := j2.Unacked(); len(un) != 1 || un[0].ID != "c-done" {
		t.Fatalf("unacked %+v, want c-done", un)
	}
	if fresh, err := j2.Refuse("c-refused", exp, []byte("r")); !fresh || !errors.Is(err, journal.ErrNotDurable) || !errors.Is(err, syscall.EROFS) {
		t.Fatalf("Refuse on a read-only folder: %v %v, want kept in memory (EROFS)", fresh, err)
	}
	if fresh, err := j2.Begin("c-refused", exp, "diag.run", nil); fresh || err != nil {
		t.Fatalf("Begin of the refused id: %v %v, want seen", fresh, err)
	}
	tmpfs.ReadWrite(t, dir)
	if err := j2.Flush(); err != nil {
		t.Fatal(err)
	}
	j3, err := journal.Open(path, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if u, ok := j3.Final("c-refused"); !ok || string(u) != "r" {
		t.Fatal("the refusal kept while read-only was not written once writable")
	}
}
