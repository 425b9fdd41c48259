package secretfile

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestReadRefusesEveryGroupOrOtherBit: each of the six group/other
// permission bits alone is refused; 0600 and 0400 are read.
func TestReadRefusesEveryGroupOrOtherBit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(path, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, bit := range []os.FileMode{0o040, 0o020, 0o010, 0o004, 0o002, 0o001} {
		if err := os.Chmod(path, 0o600|bit); err != nil {
			t.Fatal(err)
		}
		if _, err := Read("key file", path); !errors.Is(err, ErrOpen) {
			t.Errorf("mode %04o: err %v, want ErrOpen", 0o600|bit, err)
		}
	}
	for _, mode := range []os.FileMode{0o600, 0o400} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		if b, err := Read("key file", path); err != nil || string(b) != "secret\n" {
			t.Errorf("mode %04o: %q, %v", mode, b, err)
		}
	}
}

// TestReadRefusesLargeAndOddFiles: a file over MaxSize and a directory are
// refused.
func TestReadRefusesLargeAndOddFiles(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, make([]byte, MaxSize+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Read("key file", big); err == nil {
		t.Error("a file over MaxSize was read")
	}
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := Read("key file", sub); err == nil {
		t.Error("a directory was read")
	}
}
