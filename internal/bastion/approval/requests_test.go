package approval

import (
	"strings"
	"testing"
	"time"
)

const moveOp = "files:move-plan"

func TestApprovalBoundToOpAndDigestSpentOnce(t *testing.T) {
	f := newFixture(t)
	f.enroll(t)
	dA, dB := digestOf(moveOp, `{"a":1}`), digestOf(moveOp, `{"b":2}`)
	a, err := f.s.Ask(moveOp, dA, "move a")
	must(t, err)
	b, err := f.s.Ask(moveOp, dB, "move b")
	must(t, err)
	if !strings.HasPrefix(a.ID, "apr_") || len(a.ID) != 24 || a.ID == b.ID || !a.Expires.Equal(a.Created.Add(5*time.Minute)) {
		t.Fatalf("request %+v", a)
	}
	wantRefused(t, f.s.Approve(a.ID, f.wrongCode(t)), ReasonCodeInvalid)
	wantRefused(t, f.s.Spend(a.ID, moveOp, dA), ReasonNotApproved)
	must(t, f.s.Approve(a.ID, f.fresh(t)))
	// A's approval does not spend B's op, nor A's id with another op or digest.
	wantRefused(t, f.s.Spend(a.ID, moveOp, dB), ReasonApprovalMismatch)
	wantRefused(t, f.s.Spend(a.ID, "files:read", dA), ReasonApprovalMismatch)
	wantRefused(t, f.s.Spend(b.ID, moveOp, dB), ReasonNotApproved)
	wantRefused(t, f.s.Spend("apr_aaaaaaaaaaaaaaaaaaaa", moveOp, dA), ReasonUnknownRequest)
	must(t, f.s.Spend(a.ID, moveOp, dA))
	wantRefused(t, f.s.Spend(a.ID, moveOp, dA), ReasonApprovalSpent)
	wantRefused(t, f.open(t).Spend(a.ID, moveOp, dA), ReasonApprovalSpent)
	wantRefused(t, f.s.Approve(a.ID, f.fresh(t)), ReasonApprovalSpent)
	p, err := f.s.Pending()
	must(t, err)
	if len(p) != 1 || p[0].ID != b.ID {
		t.Fatalf("pending %+v, want only b", p)
	}
}

func TestApprovalRefusedAfterFiveMinutes(t *testing.T) {
	f := newFixture(t)
	f.enroll(t)
	d := digestOf(moveOp, "{}")
	late, err := f.s.Ask(moveOp, d, "late approve")
	must(t, err)
	unspent, err := f.s.Ask(moveOp, d, "late spend")
	must(t, err)
	f.clk.Advance(4*time.Minute + 30*time.Second)
	must(t, f.s.Approve(unspent.ID, f.codeAt(t, f.clk.Now())))
	f.clk.Advance(30 * time.Second) // exactly Created + 5 min
	wantRefused(t, f.s.Approve(late.ID, f.codeAt(t, f.clk.Now())), ReasonApprovalExpired)
	wantRefused(t, f.s.Spend(unspent.ID, moveOp, d), ReasonApprovalExpired)
	_, err = f.s.Get(late.ID)
	wantRefused(t, err, ReasonApprovalExpired)
	if p, err := f.s.Pending(); err != nil || len(p) != 0 {
		t.Fatalf("pending %v %v, want none", p, err)
	}
}

func TestDenyEndsRequest(t *testing.T) {
	f := newFixture(t)
	f.enroll(t)
	d := digestOf(moveOp, "{}")
	r, err := f.s.Ask(moveOp, d, "x")
	must(t, err)
	got, err := f.open(t).Get(r.ID)
	must(t, err)
	if got.ID != r.ID || got.Digest != d || got.Approved {
		t.Fatalf("Get %+v", got)
	}
	must(t, f.s.Deny(r.ID))
	wantRefused(t, f.s.Approve(r.ID, f.fresh(t)), ReasonUnknownRequest)
	wantRefused(t, f.s.Spend(r.ID, moveOp, d), ReasonUnknownRequest)
	wantRefused(t, f.s.Deny(r.ID), ReasonUnknownRequest)
}

func TestAskLimits(t *testing.T) {
	f := newFixture(t)
	d := digestOf(moveOp, "{}")
	for i := 0; i < 64; i++ {
		_, err := f.s.Ask(moveOp, d, "x")
		must(t, err)
	}
	_, err := f.s.Ask(moveOp, d, "x")
	wantRefused(t, err, ReasonTooManyPending)
	f.clk.Advance(RequestTTL)
	_, err = f.s.Ask(moveOp, d, "x")
	must(t, err)

	_, err = f.s.Ask(moveOp, strings.ToUpper(d), "x")
	wantRefused(t, err, ReasonBadRequest)
	_, err = f.s.Ask("files:move plan", d, "x")
	wantRefused(t, err, ReasonBadRequest)
	_, err = f.s.Ask(moveOp, d, "move "+strings.Repeat("y", MaxSummary))
	wantRefused(t, err, ReasonSummaryTooLong)
	long := "move \x1b[2Jall\u202e" + strings.Repeat("y", MaxSummary-20)
	r, err := f.s.Ask(moveOp, d, long)
	must(t, err)
	if strings.ContainsAny(r.Summary, "\x1b\u202e") || !strings.HasPrefix(r.Summary, "move ?[2Jall?y") || len([]rune(r.Summary)) != len([]rune(long)) {
		t.Fatalf("summary kept as %q...", r.Summary[:40])
	}
}

func TestTwoStoresSeeEachOthersApprovals(t *testing.T) {
	f := newFixture(t)
	f.enroll(t)
	run, approve := f.s, f.open(t) // `bcd bastion run` and `bcd bastion approve`
	d := digestOf(moveOp, `{"moves":[]}`)
	r, err := run.Ask(moveOp, d, "move")
	must(t, err)
	p, err := approve.Pending()
	must(t, err)
	if len(p) != 1 || p[0].ID != r.ID || p[0].Summary != "move" {
		t.Fatalf("the approving store sees %+v", p)
	}
	must(t, approve.Approve(r.ID, f.fresh(t)))
	must(t, run.Spend(r.ID, moveOp, d))
	wantRefused(t, approve.Spend(r.ID, moveOp, d), ReasonApprovalSpent)
}

func TestLockoutAfterFiveRefusedWrites(t *testing.T) {
	f := newFixture(t)
	f.enroll(t)
	for i := 0; i < 4; i++ {
		wantRefused(t, f.s.VerifyCode(f.wrongCode(t)), ReasonCodeInvalid) // counts as a refused write
		f.clk.Advance(time.Minute)
	}
	if _, locked := f.s.WritesLocked(); locked {
		t.Fatal("locked after 4 refused writes")
	}
	f.open(t).NoteRefusedWrite()
	fifth := f.clk.Now()
	until, locked := f.s.WritesLocked()
	if !locked || !until.Equal(fifth.Add(10*time.Minute)) {
		t.Fatalf("after 5: locked %v until %v, want until %v", locked, until, fifth.Add(10*time.Minute))
	}
	f.clk.Advance(10*time.Minute - time.Second)
	if _, locked := f.s.WritesLocked(); !locked {
		t.Fatal("unlocked before 10 minutes")
	}
	f.clk.Advance(time.Second)
	if _, locked := f.s.WritesLocked(); locked {
		t.Fatal("still locked 10 minutes after the 5th refusal")
	}
}

func TestRefusalsSpreadOverMoreThanTenMinutesDoNotLock(t *testing.T) {
	f := newFixture(t)
	for i := 0; i < 15; i++ {
		f.s.NoteRefusedWrite()
		if _, locked := f.s.WritesLocked(); locked {
			t.Fatalf("locked after refusal %d, 3 minutes apart", i+1)
		}
		f.clk.Advance(3 * time.Minute)
	}
}

func TestDamagedApprovalsFileFailsClosed(t *testing.T) {
	f := newFixture(t)
	f.enroll(t)
	d := digestOf(moveOp, "{}")
	r, err := f.s.Ask(moveOp, d, "x")
	must(t, err)
	must(t, f.s.Approve(r.ID, f.fresh(t)))
	b := f.readFile(t, approvalsFile)
	b[20] ^= 0x80
	f.writeFile(t, approvalsFile, b)
	wantRefused(t, f.s.Spend(r.ID, moveOp, d), ReasonStateDamaged)
	_, err = f.s.Ask(moveOp, d, "x")
	wantRefused(t, err, ReasonStateDamaged)
	if _, locked := f.s.WritesLocked(); !locked {
		t.Fatal("writes open with a damaged approvals file")
	}
}
