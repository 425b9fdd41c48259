package spentfile_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/tickets"
	"github.com/bettercompute/bettercompute/internal/tickets/spentfile"
)

var t0 = time.Date(2026, 12, 4, 5, 0, 0, 0, time.UTC)

func open(t *testing.T, path string, clk clock.Clock, capacity int) *spentfile.Store {
	t.Helper()
	s, err := spentfile.Open(path, clk, capacity)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// wantSpent checks that s refuses each of jtis as spent.
func wantSpent(t *testing.T, s *spentfile.Store, exp time.Time, jtis ...string) {
	t.Helper()
	for _, jti := range jtis {
		if err := s.Spend(context.Background(), jti, exp); !errors.Is(err, tickets.ErrSpent) {
			t.Fatalf("%s after reopen: %v, want ErrSpent", jti, err)
		}
	}
}

// TestSpentSurvivesReopen: a jti spent by one store is refused as spent by
// the next store opened on the same file (a bcd restart), whatever the
// clock, until its keeping time has passed; the file is 0600.
func TestSpentSurvivesReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "spent.jsonl")
	clk := clock.NewFake(t0)
	exp := t0.Add(tickets.Lifetime)
	if err := open(t, path, clk, 0).Spend(ctx, "tk_a", exp); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("file: %v %v, want mode 0600", fi, err)
	}
	// A clock set back an hour (a slow node) still finds it spent.
	clk.Set(t0.Add(-time.Hour))
	s := open(t, path, clk, 0)
	if err := s.Spend(ctx, "tk_a", exp); !errors.Is(err, tickets.ErrSpent) {
		t.Fatalf("after reopen: %v, want ErrSpent", err)
	}
	if err := s.Spend(ctx, "tk_b", exp); err != nil {
		t.Fatalf("another jti: %v", err)
	}
	// Past the keeping time the entry is dropped by the next open.
	clk.Set(exp.Add(tickets.Retention + time.Millisecond))
	s = open(t, path, clk, 0)
	if err := s.Spend(ctx, "tk_a", exp.Add(time.Hour)); err != nil {
		t.Fatalf("tk_a after its keeping time: %v, want it forgotten", err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(b, []byte("\n")); n != 1 {
		t.Fatalf("file holds %d lines, want the one new entry (the expired ones compacted away):\n%s", n, b)
	}
}

// TestTornLineIgnored: a torn last line (a crash mid-append) is ignored,
// the lines before it count, and the next open's compaction drops it so
// later appends are read back.
func TestTornLineIgnored(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "spent.jsonl")
	exp := t0.Add(tickets.Lifetime)
	line := fmt.Sprintf("{\"jti\":\"tk_a\",\"exp\":%d}\n{\"jti\":\"tk_b\",\"ex", exp.UnixMilli())
	if err := os.WriteFile(path, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(t0)
	s := open(t, path, clk, 0)
	if err := s.Spend(ctx, "tk_a", exp); !errors.Is(err, tickets.ErrSpent) {
		t.Fatalf("tk_a: %v, want ErrSpent", err)
	}
	if err := s.Spend(ctx, "tk_b", exp); err != nil {
		t.Fatalf("tk_b (torn, never honoured): %v", err)
	}
	wantSpent(t, open(t, path, clk, 0), exp, "tk_a", "tk_b")
}

// TestUnwritableRefusesThenRewrites: a spend that cannot be written is an
// error (the ticket is refused) and its jti stays spent; once the folder
// is back, the next spend rewrites the whole file, so both are read back.
func TestUnwritableRefusesThenRewrites(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "spent.jsonl")
	clk := clock.NewFake(t0)
	exp := t0.Add(tickets.Lifetime)
	s := open(t, path, clk, 0)
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	err := s.Spend(ctx, "tk_a", exp)
	if err == nil || errors.Is(err, tickets.ErrSpent) || errors.Is(err, tickets.ErrFull) {
		t.Fatalf("spend with its folder gone: %v, want a write error", err)
	}
	if err := s.Spend(ctx, "tk_a", exp); !errors.Is(err, tickets.ErrSpent) {
		t.Fatalf("the refused jti again: %v, want ErrSpent (never honoured later)", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := s.Spend(ctx, "tk_b", exp); err != nil {
		t.Fatalf("spend with the folder back: %v", err)
	}
	wantSpent(t, open(t, path, clk, 0), exp, "tk_a", "tk_b")
}

// TestFileStaysBounded: appends are compacted once as many lines were
// written as the store holds jtis, so the file never holds more than
// twice its capacity, and a full store refuses (ErrFull) rather than
// forget a jti.
func TestFileStaysBounded(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "spent.jsonl")
	clk := clock.NewFake(t0)
	const capacity = 4
	s := open(t, path, clk, capacity)
	for i := range 40 {
		exp := clk.Now().Add(time.Second)
		if err := s.Spend(ctx, fmt.Sprintf("tk_%d", i), exp); err != nil {
			t.Fatalf("spend %d: %v", i, err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if n := bytes.Count(b, []byte("\n")); n > 2*capacity {
			t.Fatalf("after spend %d the file holds %d lines, want at most %d", i, n, 2*capacity)
		}
		clk.Set(exp.Add(tickets.Retention + time.Millisecond))
	}
	for i := range capacity {
		if err := s.Spend(ctx, fmt.Sprintf("tk_full_%d", i), clk.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Spend(ctx, "tk_one_more", clk.Now().Add(time.Hour)); !errors.Is(err, tickets.ErrFull) {
		t.Fatalf("spend into a full store: %v, want ErrFull", err)
	}
}

// TestDamagedFileRefused: a line that does not parse before the last one,
// or one past the line bound, is a damaged file (Open fails) rather than
// the end of the record: the jtis after it are never forgotten.
func TestDamagedFileRefused(t *testing.T) {
	exp := t0.Add(tickets.Lifetime).UnixMilli()
	good := func(jti string) string { return fmt.Sprintf("{\"jti\":%q,\"exp\":%d}\n", jti, exp) }
	for name, body := range map[string]string{
		"a bad line in the middle": good("tk_a") + "GARBAGE\n" + good("tk_b"),
		"an empty jti":             good("tk_a") + "{\"jti\":\"\",\"exp\":1}\n" + good("tk_b"),
		"a line past the bound":    good("tk_a") + "{\"jti\":\"" + strings.Repeat("x", 5000) + "\",\"exp\":1}\n" + good("tk_b"),
	} {
		path := filepath.Join(t.TempDir(), "spent.jsonl")
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := spentfile.Open(path, clock.NewFake(t0), 0); err == nil {
			t.Errorf("%s: opened, want an error (the entries after it would be forgotten)", name)
		}
	}
}

// TestClockSetBackStillOpens: the file can hold more jtis than the
// store's capacity (entries expired since the last compaction stay in it
// until the next); after the clock is set back they all count as
// unexpired again. The store still opens with every one of them spent,
// and refuses new spends (ErrFull) until enough expire.
func TestClockSetBackStillOpens(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "spent.jsonl")
	clk := clock.NewFake(t0)
	const capacity = 4
	s := open(t, path, clk, capacity)
	spend := func(jti string, life time.Duration) {
		t.Helper()
		if err := s.Spend(ctx, jti, clk.Now().Add(life)); err != nil {
			t.Fatalf("spend %s: %v", jti, err)
		}
	}
	past := func() { clk.Set(clk.Now().Add(time.Second + tickets.Retention + time.Millisecond)) }
	for i := range capacity {
		spend(fmt.Sprintf("tk_w%d", i), time.Second)
	}
	past()
	spend("tk_x", time.Hour) // compacts: the file holds tk_x alone
	for i := range capacity - 1 {
		spend(fmt.Sprintf("tk_y%d", i), time.Second)
	}
	past()
	spend("tk_z", time.Hour) // appended: tk_x, three expired tk_y, tk_z
	clk.Set(t0)
	s = open(t, path, clk, capacity)
	if err := s.Spend(ctx, "tk_new", t0.Add(time.Hour)); !errors.Is(err, tickets.ErrFull) {
		t.Fatalf("spend after the clock went back: %v, want ErrFull (more than capacity held)", err)
	}
	wantSpent(t, s, t0.Add(time.Hour), "tk_x", "tk_y0", "tk_y1", "tk_y2", "tk_z")
}
