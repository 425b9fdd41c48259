package approval

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestRootGrantEndsWithClockAndRevoke(t *testing.T) {
	f := newFixture(t)
	wantRefused(t, f.s.GiveRootGrant(t0.Add(time.Hour), "123456"), ReasonNotEnrolled)
	f.enroll(t)
	if _, ok := f.s.RootGrant(); ok {
		t.Fatal("a root grant before any was given")
	}
	wantRefused(t, f.s.GiveRootGrant(f.clk.Now().Add(time.Hour), f.wrongCode(t)), ReasonCodeInvalid)
	wantRefused(t, f.s.GiveRootGrant(f.clk.Now().Add(-time.Second), f.fresh(t)), ReasonBadWindow)
	wantRefused(t, f.s.GiveRootGrant(f.clk.Now().Add(30*24*time.Hour+time.Minute), f.fresh(t)), ReasonBadWindow)

	until := f.clk.Now().Add(time.Hour)
	must(t, f.s.GiveRootGrant(until, f.fresh(t)))
	if u, ok := f.open(t).RootGrant(); !ok || !u.Equal(until) {
		t.Fatalf("RootGrant %v %v, want until %v", u, ok, until)
	}
	f.clk.Set(until.Add(-time.Second))
	if _, ok := f.s.RootGrant(); !ok {
		t.Fatal("root grant ended early")
	}
	f.clk.Set(until)
	if _, ok := f.s.RootGrant(); ok {
		t.Fatal("root grant holds at its end")
	}

	must(t, f.s.GiveRootGrant(f.clk.Now().Add(time.Hour), f.fresh(t)))
	must(t, f.open(t).RevokeRootGrant())
	if _, ok := f.s.RootGrant(); ok {
		t.Fatal("root grant holds after revoke")
	}
	must(t, f.s.RevokeRootGrant()) // none: no error
}

func TestRootGrantTamperedOrCopiedHoldsNone(t *testing.T) {
	f := newFixture(t)
	f.enroll(t)
	must(t, f.s.GiveRootGrant(f.clk.Now().Add(time.Hour), f.fresh(t)))
	good := f.readFile(t, rootFile)
	bad := append([]byte(nil), good...)
	bad[len(bad)-3] ^= 4
	f.writeFile(t, rootFile, bad)
	if _, ok := f.s.RootGrant(); ok {
		t.Fatal("a tampered root grant holds")
	}
	// The same sealed bytes on a bastion with another id hold nothing either.
	g := newFixture(t)
	g.bid = "bastion-2"
	g.s = g.open(t)
	must(t, os.WriteFile(filepath.Join(g.dir, rootFile), good, 0o600))
	g.clk.Set(f.clk.Now())
	if _, ok := g.s.RootGrant(); ok {
		t.Fatal("a root grant copied from another bastion holds")
	}
	// Nor under another file's name (another key).
	f.writeFile(t, anchorFile, good)
	if f.s.Anchored() {
		t.Fatal("a root grant blob opens as the anchor")
	}
}

func TestAnchorAndUnanchor(t *testing.T) {
	f := newFixture(t)
	f.enroll(t)
	if f.s.Anchored() {
		t.Fatal("anchored by default")
	}
	must(t, f.s.Anchor())
	if !f.open(t).Anchored() {
		t.Fatal("anchor not seen by another store")
	}
	wantRefused(t, f.s.Unanchor(f.wrongCode(t)), ReasonCodeInvalid)
	if !f.s.Anchored() {
		t.Fatal("a wrong code unanchored")
	}
	must(t, f.s.Unanchor(f.fresh(t)))
	if f.s.Anchored() {
		t.Fatal("anchored after Unanchor")
	}
	must(t, f.s.Anchor())
	b := f.readFile(t, anchorFile)
	b[15] ^= 1
	f.writeFile(t, anchorFile, b)
	if f.s.Anchored() {
		t.Fatal("a tampered anchor counts")
	}
}
