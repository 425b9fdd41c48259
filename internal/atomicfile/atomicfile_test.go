package atomicfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// names lists the entries of dir.
func names(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// wantFile checks path's content and permission bits.
func wantFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil || string(got) != content {
		t.Fatalf("content = %q (%v), want %q", got, err, content)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != mode {
		t.Fatalf("mode = %v (%v), want %v", fi.Mode().Perm(), err, mode)
	}
}

// TestWrite checks that Write creates and replaces a file with exactly the
// content and mode given (the umask does not narrow it), and leaves no
// temp file beside it.
func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	for _, c := range []struct {
		content string
		mode    os.FileMode
	}{{"one", 0o600}, {"two, longer", 0o644}, {"", 0o640}, {"x", 0o666}} {
		if err := Write(path, []byte(c.content), c.mode); err != nil {
			t.Fatal(err)
		}
		wantFile(t, path, c.content, c.mode)
		if n := names(t, dir); len(n) != 1 || n[0] != "f" {
			t.Fatalf("directory holds %v, want only f", n)
		}
	}
}

// TestWriteNew checks that WriteNew creates a file that does not exist
// and refuses (fs.ErrExist) one that does, leaving it as it was.
func TestWriteNew(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kek")
	if err := WriteNew(path, []byte("first"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := WriteNew(path, []byte("second"), 0o644)
	if !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second WriteNew: %v, want fs.ErrExist", err)
	}
	wantFile(t, path, "first", 0o600)
	if n := names(t, dir); len(n) != 1 {
		t.Fatalf("directory holds %v after a refused WriteNew, want only kek", n)
	}
}

// TestWriteNewRace checks that of many concurrent WriteNew calls for one
// path exactly one succeeds and the file holds its content.
func TestWriteNewRace(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "once")
	var wg sync.WaitGroup
	won := make(chan string, 16)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := string(rune('a' + i))
			if WriteNew(path, []byte(c), 0o600) == nil {
				won <- c
			}
		}()
	}
	wg.Wait()
	close(won)
	var winners []string
	for c := range won {
		winners = append(winners, c)
	}
	if len(winners) != 1 {
		t.Fatalf("%d writers won: %v", len(winners), winners)
	}
	wantFile(t, path, winners[0], 0o600)
	if n := names(t, dir); len(n) != 1 {
		t.Fatalf("directory holds %v, want only once", n)
	}
}

// TestWriteErrorLeavesNoTemp checks failures: a missing directory
// (fs.ErrNotExist), and a rename that fails after the temp file was
// written (the target is a non-empty directory), which must leave the
// target untouched and no temp file behind.
func TestWriteErrorLeavesNoTemp(t *testing.T) {
	if err := Write(filepath.Join(t.TempDir(), "missing", "f"), []byte("x"), 0o600); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing dir: %v, want fs.ErrNotExist", err)
	}
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	if err := os.MkdirAll(filepath.Join(target, "inside"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := Write(target, []byte("x"), 0o600); err == nil {
		t.Fatal("Write over a non-empty directory succeeded")
	}
	if n := names(t, dir); len(n) != 1 || n[0] != "target" {
		t.Fatalf("directory holds %v after a failed Write, want only target", n)
	}
	if fi, err := os.Stat(target); err != nil || !fi.IsDir() {
		t.Fatalf("target changed: %v %v", fi, err)
	}
}
