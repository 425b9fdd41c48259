package ops

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/netguard"
)

// Observe ops run with no factor enrolled, with writes locked, and never
// ask the person.
func TestObserveNeedsNoApproval(t *testing.T) {
	f := newFixture(t, netguard.Config{})
	for range 5 {
		f.appr.NoteRefusedWrite()
	}
	if _, locked := f.appr.WritesLocked(); !locked {
		t.Fatal("fake: writes not locked")
	}
	res, err := f.s.Do(context.Background(), f.op(t, KindObserveDisk, EmptyArgs{}, ""))
	if err != nil {
		t.Fatalf("observe:disk: %v", err)
	}
	fss := res.(map[string]any)["filesystems"].([]Filesystem)
	if len(fss) != 2 || fss[0].Path != "/" || fss[1].Path != f.dir || fss[0].TotalBytes == 0 {
		t.Fatalf("filesystems = %+v", fss)
	}
	res, err = f.s.Do(context.Background(), f.op(t, KindObserveProcs, EmptyArgs{}, ""))
	if err != nil {
		t.Fatalf("observe:procs: %v", err)
	}
	m := res.(map[string]any)
	procs := m["processes"].([]Process)
	found := false
	for _, p := range procs {
		found = found || p.PID == os.Getpid() && p.Name == "ops.test"
	}
	if !found || m["count"].(int) < len(procs) || len(procs) > MaxProcs {
		t.Fatalf("procs: own process missing or counts wrong: count %v, %d listed", m["count"], len(procs))
	}
	res, err = f.s.Do(context.Background(), f.op(t, KindFilesRead, FilesArgs{Share: f.share, Path: "a.txt"}, ""))
	if err != nil || res.(readResult).Data != "aGVsbG8=" {
		t.Fatalf("files:read = %v, %v", res, err)
	}
	if f.appr.asked() != 0 {
		t.Fatal("a read asked for an approval")
	}
	if e := f.audit.last(t); e.kind != AuditOp || !strings.Contains(e.detail, "kind=files:read") {
		t.Fatalf("audit = %+v", e)
	}
}

// observe:procs lists at most MaxProcs processes and counts them all.
func TestObserveProcsCapped(t *testing.T) {
	dir := t.TempDir()
	for pid := 1; pid <= MaxProcs+20; pid++ {
		p := filepath.Join(dir, strconv.Itoa(pid))
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p, "comm"), []byte("x\x1b[31m\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	res, err := observeProcs(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := res.(map[string]any)
	procs := m["processes"].([]Process)
	if m["count"] != MaxProcs+20 || len(procs) != MaxProcs || procs[0].Name != "x[31m" {
		t.Fatalf("count %v, %d listed, first %+v", m["count"], len(procs), procs[0])
	}
}

// A write with no factor enrolled is refused with the enroll hint, audited,
// and changes nothing.
func TestWriteWithoutFactor(t *testing.T) {
	f := newFixture(t, netguard.Config{})
	_, err := f.s.Do(context.Background(), f.op(t, KindFilesMove, MovePlanArgs{Share: f.share, Moves: []Move{{From: "a.txt"}}}, ""))
	re := wantRefused(t, err, CodeAccessDenied, ReasonFactorNotEnrolled)
	if re.Detail != EnrollHint {
		t.Fatalf("detail %q", re.Detail)
	}
	if _, err := os.Stat(filepath.Join(f.dir, "a.txt")); err != nil {
		t.Fatal("the file moved")
	}
	if e := f.audit.last(t); e.kind != AuditRefuse || e.reason != ReasonFactorNotEnrolled {
		t.Fatalf("audit = %+v", e)
	}
}

// A write asks the person, runs once with the approval, and the approval
// is bound to the kind and args and spent on first use.
func TestApprovalBoundAndSpentOnce(t *testing.T) {
	f := newFixture(t, netguard.Config{})
	f.appr.enrolled.Store(true)
	ctx := context.Background()
	args := dryRun(f.share, "echo hi > out.txt")
	_, err := f.s.Do(ctx, f.op(t, KindDryRun, args, ""))
	re := wantRefused(t, err, CodeApprovalRequired, ReasonApprovalRequired)
	if !validID("apr_", 20, re.ApprovalRequest) || !re.ApprovalExpires.Equal(f.clk.Now().Add(5*time.Minute)) ||
		!strings.HasPrefix(re.Summary, "action:dry-run in share "+f.share) || !strings.Contains(re.Summary, "echo hi") {
		t.Fatalf("approval request %+v", re)
	}
	if e := f.audit.last(t); e.reason != ReasonApprovalRequired || !strings.Contains(e.detail, re.ApprovalRequest) {
		t.Fatalf("audit = %+v", e)
	}
	id := re.ApprovalRequest
	_, err = f.s.Do(ctx, f.op(t, KindDryRun, args, id))
	wantRefused(t, err, CodeAccessDenied, "not-approved")
	f.appr.approve(t, id)
	changed := dryRun(f.share, "echo other > out.txt")
	_, err = f.s.Do(ctx, f.op(t, KindDryRun, changed, id))
	wantRefused(t, err, CodeAccessDenied, "approval-mismatch")
	_, err = f.s.Do(ctx, f.op(t, KindApply, ApplyArgs{Plan: testID("pl_", 20, 9), Digest: strings.Repeat("0", 64)}, id))
	wantRefused(t, err, CodeNotFound, "unknown-plan") // pre-check first: the approval is not touched
	if _, err := f.s.Do(ctx, f.op(t, KindDryRun, args, id)); err != nil {
		t.Fatalf("approved dry run: %v", err)
	}
	if e := f.audit.last(t); e.kind != AuditOp || !strings.Contains(e.detail, "by=approval") {
		t.Fatalf("audit = %+v", e)
	}
	_, err = f.s.Do(ctx, f.op(t, KindDryRun, args, id))
	wantRefused(t, err, CodeAccessDenied, "approval-spent")
	if n := f.actions.ranDryRun(); n != 1 {
		t.Fatalf("dry run ran %d times, want 1", n)
	}
	if n := len(f.appr.refused); n != 3 {
		t.Fatalf("%d refused writes counted, want 3 (not approved, mismatch, spent)", n)
	}
}

// A move plan runs with its approval and moves the file on disk.
func TestMovePlanWithApproval(t *testing.T) {
	f := newFixture(t, netguard.Config{})
	f.appr.enrolled.Store(true)
	ctx := context.Background()
	args := MovePlanArgs{Share: f.share, Moves: []Move{{From: "a.txt"}}}
	_, err := f.s.Do(ctx, f.op(t, KindFilesMove, args, ""))
	re := wantRefused(t, err, CodeApprovalRequired, ReasonApprovalRequired)
	if re.Summary != `files:move-plan in share `+f.share+`: move "a.txt" to "(archive)";` {
		t.Fatalf("summary %q", re.Summary)
	}
	f.appr.approve(t, re.ApprovalRequest)
	if _, err := f.s.Do(ctx, f.op(t, KindFilesMove, args, re.ApprovalRequest)); err != nil {
		t.Fatalf("approved move: %v", err)
	}
	if _, err := os.Stat(filepath.Join(f.dir, "Archive", "a.txt")); err != nil {
		t.Fatalf("not archived: %v", err)
	}
}

// A request that cannot run is refused by the kind's pre-check before
// the person is asked.
func TestPrecheckBeforeAsk(t *testing.T) {
	f := newFixture(t, netguard.Config{})
	f.appr.enrolled.Store(true)
	_, err := f.s.Do(context.Background(), f.op(t, KindFilesMove, MovePlanArgs{Share: f.share, Moves: []Move{{From: "missing"}}}, ""))
	wantRefused(t, err, CodeNotFound, "not-found")
	_, err = f.s.Do(context.Background(), f.op(t, KindDryRun, dryRun(testID("sh_", 12, 99), "true"), ""))
	wantRefused(t, err, CodeNotFound, "unknown-share")
	if f.appr.asked() != 0 {
		t.Fatal("the person was asked for a request that cannot run")
	}
	// A request too long to show whole is refused, never shown clipped.
	_, err = f.s.Do(context.Background(), f.op(t, KindDryRun, DryRunArgs{Share: f.share, Script: strings.Repeat("x", MaxScript),
		Effects: []string{strings.Repeat("e", 2000)}}, ""))
	wantRefused(t, err, CodeAccessDenied, ReasonTooLarge)
	if f.appr.asked() != 0 {
		t.Fatal("the person was asked with a clipped text")
	}
}

// Five refused writes lock writes for 10 minutes, even with a good
// approval; reads still run.
func TestWritesLocked(t *testing.T) {
	f := newFixture(t, netguard.Config{})
	f.appr.enrolled.Store(true)
	ctx := context.Background()
	args := dryRun(f.share, "true")
	_, err := f.s.Do(ctx, f.op(t, KindDryRun, args, ""))
	good := wantRefused(t, err, CodeApprovalRequired, ReasonApprovalRequired).ApprovalRequest
	f.appr.approve(t, good)
	for i := range 5 {
		_, err := f.s.Do(ctx, f.op(t, KindDryRun, args, testID("apr_", 20, uint64(100+i))))
		wantRefused(t, err, CodeAccessDenied, "unknown-request")
	}
	_, err = f.s.Do(ctx, f.op(t, KindDryRun, args, good))
	wantRefused(t, err, CodeAccessDenied, ReasonWritesLocked)
	if _, err := f.s.Do(ctx, f.op(t, KindFilesStat, FilesArgs{Share: f.share, Path: "a.txt"}, "")); err != nil {
		t.Fatalf("a read while locked: %v", err)
	}
	f.clk.Advance(10 * time.Minute)
	_, err = f.s.Do(ctx, f.op(t, KindDryRun, args, good))
	wantRefused(t, err, CodeAccessDenied, "approval-expired")
	_, err = f.s.Do(ctx, f.op(t, KindDryRun, args, ""))
	fresh := wantRefused(t, err, CodeApprovalRequired, ReasonApprovalRequired).ApprovalRequest
	f.appr.approve(t, fresh)
	if _, err := f.s.Do(ctx, f.op(t, KindDryRun, args, fresh)); err != nil {
		t.Fatalf("after the lock: %v", err)
	}
}

// A standing grant runs a write with no approval while it has runs left;
// then the person is asked. A terminal never runs on a standing grant.
func TestStandingGrant(t *testing.T) {
	f := newFixture(t, netguard.Config{})
	f.appr.enrolled.Store(true)
	f.appr.standing[KindFilesMove] = 1
	f.appr.standing[KindTerminal] = 5
	ctx := context.Background()
	if _, err := f.s.Do(ctx, f.op(t, KindFilesMove, MovePlanArgs{Share: f.share, Moves: []Move{{From: "a.txt", To: "b.txt"}}}, "")); err != nil {
		t.Fatalf("move under a standing grant: %v", err)
	}
	if e := f.audit.last(t); !strings.Contains(e.detail, "by=standing") {
		t.Fatalf("audit = %+v", e)
	}
	_, err := f.s.Do(ctx, f.op(t, KindFilesMove, MovePlanArgs{Share: f.share, Moves: []Move{{From: "b.txt", To: "c.txt"}}}, ""))
	wantRefused(t, err, CodeApprovalRequired, ReasonApprovalRequired)
	_, err = f.s.Do(ctx, f.op(t, KindTerminal, TerminalArgs{Session: testID("ts_", 20, 1)}, ""))
	wantRefused(t, err, CodeApprovalRequired, ReasonApprovalRequired)
	if f.appr.standing[KindTerminal] != 5 {
		t.Fatal("a terminal used a standing grant")
	}
	// An apply never runs on a standing grant (it lands a change list
	// someone must have seen); on an anchored machine no write does.
	f.appr.standing[KindApply] = 5
	_, err = f.s.Do(ctx, f.op(t, KindApply, ApplyArgs{Plan: testID("pl_", 20, 1), Digest: strings.Repeat("a", 64)}, ""))
	if re := refusalOf(err); re == nil || re.Reason == "" || f.appr.standing[KindApply] != 5 {
		t.Fatalf("apply under a standing grant: %v (uses left %d)", err, f.appr.standing[KindApply])
	}
	f.appr.standing[KindFilesMove] = 5
	f.appr.anchored.Store(true)
	_, err = f.s.Do(ctx, f.op(t, KindFilesMove, MovePlanArgs{Share: f.share, Moves: []Move{{From: "b.txt", To: "d.txt"}}}, ""))
	wantRefused(t, err, CodeApprovalRequired, ReasonApprovalRequired)
	if f.appr.standing[KindFilesMove] != 5 {
		t.Fatal("an anchored machine ran a write on a standing grant")
	}
}

// root:run and a root terminal need the bastion running as root.
func TestRootNeedsRoot(t *testing.T) {
	f := newFixture(t, netguard.Config{})
	f.appr.enrolled.Store(true)
	ctx := context.Background()
	run := f.op(t, KindRootRun, RootRunArgs{Argv: []string{"/usr/bin/id", "-u"}}, "")
	_, err := f.s.Do(ctx, run)
	wantRefused(t, err, CodeAccessDenied, ReasonNotRoot)
	_, err = f.s.Do(ctx, f.op(t, KindTerminal, TerminalArgs{Session: testID("ts_", 20, 1), Root: true}, ""))
	wantRefused(t, err, CodeAccessDenied, ReasonNotRoot)
	if f.root.runs.Load() != 0 || f.appr.asked() != 0 {
		t.Fatal("ran or asked while not root")
	}
	f.isRoot.Store(true)
	res, err := f.s.Do(ctx, run)
	if err != nil || res.(map[string]any)["output"] != "/usr/bin/id -u" {
		t.Fatalf("root:run as root = %v, %v", res, err)
	}
	_, err = f.s.Do(ctx, f.op(t, KindTerminal, TerminalArgs{Session: testID("ts_", 20, 1), Root: true}, ""))
	re := wantRefused(t, err, CodeApprovalRequired, ReasonApprovalRequired)
	if !strings.HasSuffix(re.Summary, "as root") {
		t.Fatalf("summary %q", re.Summary)
	}
	// On a bastion running as root, a terminal not asked as root would
	// be a root shell: refused before the person is asked.
	asked := f.appr.asked()
	_, err = f.s.Do(ctx, f.op(t, KindTerminal, TerminalArgs{Session: testID("ts_", 20, 3)}, ""))
	wantRefused(t, err, CodeAccessDenied, ReasonAskRoot)
	if f.appr.asked() != asked {
		t.Fatal("asked the person for a terminal that would be root's")
	}
}

// observe:net goes through the egress guard: loopback and localhost are
// refused with netguard's reason; an allowed listener is reachable.
func TestObserveNetThroughGuard(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	f := newFixture(t, netguard.Config{})
	ctx := context.Background()
	_, err = f.s.Do(ctx, f.op(t, KindObserveNet, ObserveNetArgs{Host: "127.0.0.1", Port: port}, ""))
	wantRefused(t, err, CodeAccessDenied, string(netguard.ReasonLoopback))
	if e := f.audit.last(t); e.kind != AuditRefuse || e.reason != "loopback" {
		t.Fatalf("audit = %+v", e)
	}
	_, err = f.s.Do(ctx, f.op(t, KindObserveNet, ObserveNetArgs{Host: "localhost", Port: port}, ""))
	wantRefused(t, err, CodeAccessDenied, string(netguard.ReasonLocalhostName))
	allowed := newFixture(t, netguard.Config{Allow: []string{"127.0.0.1"}})
	res, err := allowed.s.Do(ctx, allowed.op(t, KindObserveNet, ObserveNetArgs{Host: "127.0.0.1", Port: port}, ""))
	if err != nil || !res.(probeResult).Reachable || res.(probeResult).Address != ln.Addr().String() {
		t.Fatalf("allowed probe = %+v, %v", res, err)
	}
}

// Do refuses an op of an unknown kind or with bad args INVALID_INPUT and
// audits nothing.
func TestDoRefusesMalformedWithoutAudit(t *testing.T) {
	f := newFixture(t, netguard.Config{})
	ctx := context.Background()
	_, err := f.s.Do(ctx, Op{ID: "x", Kind: "observe:k8s", Args: EmptyArgs{}})
	wantRefused(t, err, CodeInvalidInput, ReasonUnknownKind)
	_, err = f.s.Do(ctx, Op{ID: "x", Kind: KindFilesRead, Args: FilesArgs{Share: "nope"}})
	wantRefused(t, err, CodeInvalidInput, ReasonBadArgs)
	_, err = f.s.Do(ctx, Op{ID: "x", Kind: KindFilesRead, Args: MovePlanArgs{}})
	wantRefused(t, err, CodeInvalidInput, ReasonBadArgs)
	if n := len(f.audit.all()); n != 0 {
		t.Fatalf("%d audit entries for malformed ops", n)
	}
}

// A failure that is not a refusal stays an error (answered 500) and is
// audited as internal.
func TestInternalFailure(t *testing.T) {
	f := newFixture(t, netguard.Config{})
	f.appr.enrolled.Store(true)
	f.appr.standing[KindDryRun] = 1
	f.actions.fail = errors.New("runc: /secret/path exploded")
	_, err := f.s.Do(context.Background(), f.op(t, KindDryRun, dryRun(f.share, "true"), ""))
	var re *RefusedError
	if err == nil || errors.As(err, &re) {
		t.Fatalf("err = %v, want a plain error", err)
	}
	if e := f.audit.last(t); e.kind != AuditRefuse || e.reason != ReasonInternal || strings.Contains(e.detail, "secret") {
		t.Fatalf("audit = %+v", e)
	}
}

// Other packages' refusals keep their reason; codes follow the reason.
func TestRefusalOf(t *testing.T) {
	for _, tc := range []struct {
		err          error
		code, reason string
	}{
		{refuse("not-found"), CodeNotFound, "not-found"},
		{refuse("unknown-plan"), CodeNotFound, "unknown-plan"},
		{refuse("excluded"), CodeAccessDenied, "excluded"},
		{refuse("Evil\nReason"), CodeAccessDenied, ReasonRefused},
		{refuse(strings.Repeat("a", 65)), CodeAccessDenied, ReasonRefused},
		{invalid(ReasonBadArgs, ""), CodeInvalidInput, ReasonBadArgs},
	} {
		r := refusalOf(tc.err)
		if r == nil || r.Code != tc.code || r.Reason != tc.reason {
			t.Errorf("refusalOf(%v) = %+v, want %s %s", tc.err, r, tc.code, tc.reason)
		}
	}
	if refusalOf(errors.New("plain")) != nil {
		t.Error("a plain error became a refusal")
	}
}

// The digest is SHA-256 of kind, NUL and the canonical args.
func TestDigest(t *testing.T) {
	got := Digest(KindTerminal, []byte(`{"session":"ts_x","root":false}`))
	// printf 'terminal\0{"session":"ts_x","root":false}' | sha256sum
	const want = "6f351daaf64737593a2b5785f2efaca9bfde71cb3bd105477b196a3da12a6058"
	if got != want {
		t.Fatalf("Digest = %s, want %s", got, want)
	}
}

// The summary shows no control or bidi characters, is clipped, and is the
// same for the same op.
func TestSummary(t *testing.T) {
	args := dryRun(testShare, "echo \x1b[2Jhi\u202e\nrm -rf ~"+strings.Repeat("é", 3000))
	s := Summary(KindDryRun, args, "")
	if strings.ContainsAny(s, "\x1b\u202e\n") || !strings.HasSuffix(s, strings.Repeat("é", 3000)) {
		t.Fatalf("summary %q (%d bytes): want it cleaned and whole", s[:80], len(s))
	}
	if !strings.Contains(s, "echo [2Jhi | rm -rf ~") {
		t.Fatalf("summary %q", s[:120])
	}
	if Summary(KindDryRun, args, "") != s {
		t.Fatal("summary not deterministic")
	}
}
