package share

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testNow is the fake time the tests run at.
var testNow = time.Date(2026, 12, 2, 10, 30, 0, 0, time.UTC)

// wantReason fails unless err is a refusal with exactly reason.
func wantReason(t *testing.T, err error, reason string) {
	t.Helper()
	var r interface{ RefusalReason() string }
	if !errors.As(err, &r) {
		t.Fatalf("err = %v, want refusal %q", err, reason)
	}
	if r.RefusalReason() != reason {
		t.Fatalf("reason = %q (%v), want %q", r.RefusalReason(), err, reason)
	}
}

// tree makes files and links under root. A spec "path" ending in "/" is a
// folder, "path -> target" a link, anything else a file whose content is
// its own path.
func tree(t *testing.T, root string, specs ...string) {
	t.Helper()
	for _, s := range specs {
		name, target, isLink := strings.Cut(s, " -> ")
		p := filepath.Join(root, filepath.FromSlash(strings.TrimSuffix(name, "/")))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch {
		case isLink:
			err = os.Symlink(target, p)
		case strings.HasSuffix(name, "/"):
			err = os.MkdirAll(p, 0o755)
		default:
			err = os.WriteFile(p, []byte(name), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// openTest makes a folder holding specs (with an "outside" file beside it),
// shares it with excludes and opens it.
func openTest(t *testing.T, excludes []string, specs ...string) (*Folder, string) {
	t.Helper()
	base := t.TempDir()
	root := filepath.Join(base, "shared")
	tree(t, base, "outside.txt", "shared/")
	tree(t, root, specs...)
	s, err := Add(filepath.Join(base, "data"), root, excludes, testNow)
	if err != nil {
		t.Fatal(err)
	}
	f, err := OpenFolder(s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, s.Path
}

// readFile returns a file's content, failing the test if it cannot.
func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
