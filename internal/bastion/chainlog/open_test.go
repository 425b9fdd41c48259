package chainlog

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/clock"
)

func wantRefused(t *testing.T, err error, reason string) {
	t.Helper()
	var re *RefusedError
	if !errors.As(err, &re) || re.Reason != reason {
		t.Fatalf("err = %v, want reason %s", err, reason)
	}
}

func TestOpenRefusesUnsafeFiles(t *testing.T) {
	dir := t.TempDir()
	loose := filepath.Join(dir, "loose")
	if err := os.WriteFile(loose, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(loose, 0o640); err != nil {
		t.Fatal(err)
	}
	_, err := Open(loose, clock.NewFake(t0))
	wantRefused(t, err, ReasonInsecureMode)

	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	_, err = Open(link, clock.NewFake(t0))
	wantRefused(t, err, ReasonSymlink)

	_, err = Open(dir, clock.NewFake(t0))
	wantRefused(t, err, ReasonNotRegular)

	dangling := filepath.Join(dir, "dangling")
	if err := os.Symlink(filepath.Join(dir, "nowhere"), dangling); err != nil {
		t.Fatal(err)
	}
	_, err = Open(dangling, clock.NewFake(t0))
	wantRefused(t, err, ReasonSymlink)
	if _, err := os.Lstat(filepath.Join(dir, "nowhere")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("Open created the file a dangling symlink points to")
	}
}

func TestOpenRefusesSecondHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, _ := openLog(t, path)
	_, err := Open(path, clock.NewFake(t0))
	wantRefused(t, err, ReasonLocked)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l2, err := Open(path, clock.NewFake(t0))
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	l2.Close()
}

func TestAppendRefusals(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, clk := openLog(t, path)
	_, err := l.Append(Event{Kind: "Accept!"})
	wantRefused(t, err, ReasonBadKind)
	e, err := l.Append(Event{Kind: "grants", Seq: 99, Prev: "x", Hash: "y", TimeMS: 1, Detail: strings.Repeat("é", 200) + "\xff"})
	if err != nil {
		t.Fatal(err)
	}
	if e.Seq != 1 || e.Prev != Genesis || e.TimeMS != clk.Now().UnixMilli() || len(e.Detail) > MaxFieldBytes {
		t.Fatalf("Append did not fill or cut the event: %+v", e)
	}
	if n, err := VerifyFile(path); n != 1 || err != nil {
		t.Fatalf("VerifyFile = %d, %v", n, err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = l.Append(Event{Kind: "accept"})
	wantRefused(t, err, ReasonClosed)
	_, err = l.Since(0, 1)
	wantRefused(t, err, ReasonClosed)
}
