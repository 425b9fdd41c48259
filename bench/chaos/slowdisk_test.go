package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSlowDiskDelaysNestedWrites: with a delay set, a write and an fsync
// of a file two folders below the mount (where a node's journal lives)
// go through the slow file system's wait, counted, and the bytes reach
// the backing folder; with no delay nothing waits. It needs root and
// /dev/fuse (skipped otherwise, as the harness prints the fault as not
// available).
func TestSlowDiskDelaysNestedWrites(t *testing.T) {
	d, why := newSlowDisk(t.TempDir())
	if d == nil {
		t.Skip(why)
	}
	t.Cleanup(d.close)
	dir := filepath.Join(d.mount, "node", "data")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	write := func(name string) {
		t.Helper()
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write([]byte("entry\n")); err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	write("fast.log")
	if n := d.delayed.Load(); n != 0 {
		t.Fatalf("%d operations waited with no delay set", n)
	}
	d.setDelay(time.Millisecond)
	write("journal.log")
	d.setDelay(0)
	if n := d.delayed.Load(); n < 2 {
		t.Fatalf("%d operations waited, want the write and the fsync (the delay does not reach nested files)", n)
	}
	if b, err := os.ReadFile(filepath.Join(d.backing, "node", "data", "journal.log")); err != nil || string(b) != "entry\n" {
		t.Fatalf("backing file: %q %v", b, err)
	}
}
