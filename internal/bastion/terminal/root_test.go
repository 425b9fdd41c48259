package terminal

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
)

// holding is a grant that holds until an hour from now.
func holding() Grant {
	until := time.Now().Add(time.Hour)
	return func() (time.Time, bool) { return until, true }
}

type runResult struct {
	res Result
	err error
	at  time.Time // when RunRoot returned
}

func startRoot(terms *Terminals, argv []string, grant Grant) chan runResult {
	ch := make(chan runResult, 1)
	go func() {
		res, err := terms.RunRoot(context.Background(), argv, grant)
		ch <- runResult{res, err, time.Now()}
	}()
	return ch
}

func waitRoot(t *testing.T, ch chan runResult) runResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("RunRoot did not return within 5 s")
		return runResult{}
	}
}

var startedPID = regexp.MustCompile(` pid (\d+) `)

// startedPid waits for the root-run start audit and returns its pid.
func startedPid(t *testing.T, audit *auditLog) int {
	t.Helper()
	e := audit.waitFor(t, KindRootRun, EventStart)
	m := startedPID.FindStringSubmatch(e.detail)
	if m == nil {
		t.Fatalf("start audit %q has no pid", e.detail)
	}
	pid, _ := strconv.Atoi(m[1])
	return pid
}

// TestRunRootRecords: a command runs, its output is returned and written
// to a 0600 transcript, and its argv and exit code are audited (its output
// is not).
func TestRunRootRecords(t *testing.T) {
	terms, audit, dir := newTerms(t, nil)
	res, err := terms.RunRoot(context.Background(), []string{"/bin/echo", "out-of-echo"}, holding())
	if err != nil || res != (Result{ExitCode: 0, Output: "out-of-echo\n"}) {
		t.Fatalf("RunRoot = %+v, %v", res, err)
	}
	res, err = terms.RunRoot(context.Background(), []string{"/bin/false"}, holding())
	if err != nil || res.ExitCode != 1 {
		t.Fatalf("RunRoot(false) = %+v, %v", res, err)
	}
	files := transcripts(t, dir)
	if len(files) != 2 {
		t.Fatalf("transcripts %v, want 2", files)
	}
	found := false
	for _, f := range files {
		checkMode(t, f, 0o600)
		b, _ := os.ReadFile(f)
		found = found || strings.Contains(string(b), "] root command \"/bin/echo\" \"out-of-echo\"\nout-of-echo\n")
	}
	if !found {
		t.Error("no transcript holds the echo's argv and output")
	}
	end := audit.waitFor(t, KindRootRun, EventEnd)
	if !strings.Contains(end.detail, `"/bin/echo" "out-of-echo" exit 0 `) {
		t.Errorf("end audit %q lacks argv and exit 0", end.detail)
	}
	for _, e := range audit.all() {
		if strings.Contains(e.detail, "out-of-echo\n") {
			t.Errorf("audit holds the output: %q", e.detail)
		}
	}
}

// TestRunRootRevokeStops: revoking the grant stops a running command
// within 2 seconds, as grant-revoked, and its process is gone.
func TestRunRootRevokeStops(t *testing.T) {
	terms, audit, _ := newTerms(t, nil)
	var revoked atomic.Bool
	until := time.Now().Add(time.Hour)
	grant := func() (time.Time, bool) { return until, !revoked.Load() }
	ch := startRoot(terms, []string{"/bin/sleep", "30"}, grant)
	pid := startedPid(t, audit)
	revokedAt := time.Now()
	revoked.Store(true)
	r := waitRoot(t, ch)
	if took := r.at.Sub(revokedAt); took >= 2*time.Second {
		t.Errorf("stopped %v after the revoke, want < 2s", took)
	}
	if r.err != nil || r.res.Stopped != StoppedRevoked || r.res.ExitCode != -1 {
		t.Fatalf("RunRoot = %+v, %v; want stopped %s", r.res, r.err, StoppedRevoked)
	}
	if alive(pid) {
		t.Errorf("process %d still alive", pid)
	}
	audit.waitFor(t, KindRootRun, StoppedRevoked)
}

// TestRunRootExpiryStops: the grant's end passing (on the injected clock)
// stops the command as grant-expired; an end moved later is followed.
func TestRunRootExpiryStops(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	fake := clock.NewFake(t0)
	terms, audit, _ := newTerms(t, func(c *Config) { c.Clock = fake })
	var until atomic.Int64
	until.Store(t0.Add(time.Minute).UnixNano())
	grant := func() (time.Time, bool) { return time.Unix(0, until.Load()), true }
	ch := startRoot(terms, []string{"/bin/sleep", "30"}, grant)
	pid := startedPid(t, audit)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := fake.BlockUntil(ctx, 2); err != nil { // the ticker and the end timer
		t.Fatal(err)
	}
	until.Store(t0.Add(2 * time.Minute).UnixNano()) // extended
	fake.Advance(time.Minute)                       // the old end: the watcher re-arms
	if err := fake.BlockUntil(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if !alive(pid) {
		t.Fatal("command stopped at the grant's old end")
	}
	fake.Advance(time.Minute)
	r := waitRoot(t, ch)
	if r.err != nil || r.res.Stopped != StoppedExpired {
		t.Fatalf("RunRoot = %+v, %v; want stopped %s", r.res, r.err, StoppedExpired)
	}
	waitGone(t, pid)
}

// TestRunRootRefusals: each refusal has its reason, is audited, and runs
// nothing (no transcript).
func TestRunRootRefusals(t *testing.T) {
	past := func() (time.Time, bool) { return time.Now().Add(-time.Second), true }
	none := func() (time.Time, bool) { return time.Time{}, false }
	for _, tc := range []struct {
		name   string
		root   bool
		argv   []string
		grant  Grant
		reason string
	}{
		{"not-root", false, []string{"/bin/echo"}, holding(), ReasonNotRoot},
		{"no-grant", true, []string{"/bin/echo"}, none, ReasonNoRootGrant},
		{"nil-grant", true, []string{"/bin/echo"}, nil, ReasonNoRootGrant},
		{"expired-grant", true, []string{"/bin/echo"}, past, ReasonNoRootGrant},
		{"relative", true, []string{"echo", "hi"}, holding(), ReasonBadArgv},
		{"empty", true, nil, holding(), ReasonBadArgv},
		{"nul", true, []string{"/bin/echo", "a\x00b"}, holding(), ReasonBadArgv},
		{"too-long", true, append([]string{"/bin/echo"}, make([]string, MaxArgs)...), holding(), ReasonBadArgv},
	} {
		t.Run(tc.name, func(t *testing.T) {
			terms, audit, dir := newTerms(t, func(c *Config) { c.IsRoot = func() bool { return tc.root } })
			_, err := terms.RunRoot(context.Background(), tc.argv, tc.grant)
			wantRefusal(t, err, tc.reason)
			if _, ok := audit.find(KindRootRefuse, tc.reason); !ok {
				t.Errorf("refusal not audited: %v", audit.all())
			}
			if n := len(transcripts(t, dir)); n != 0 {
				t.Errorf("%d transcripts, want none", n)
			}
		})
	}
}

// TestRunRootTruncates: output over MaxOutput is cut in the Result (and
// noted) but whole in the transcript.
func TestRunRootTruncates(t *testing.T) {
	terms, _, dir := newTerms(t, nil)
	const n = MaxOutput + 100000
	res, err := terms.RunRoot(context.Background(), []string{"/usr/bin/head", "-c", strconv.Itoa(n), "/dev/zero"}, holding())
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("RunRoot = exit %d, %v", res.ExitCode, err)
	}
	if len(res.Output) != MaxOutput+len(TruncatedNote) || !strings.HasSuffix(res.Output, TruncatedNote) {
		t.Errorf("output %d bytes, want %d with the note", len(res.Output), MaxOutput+len(TruncatedNote))
	}
	if tr := onlyTranscript(t, dir); strings.Count(tr, "\x00") != n {
		t.Errorf("transcript holds %d output bytes, want %d", strings.Count(tr, "\x00"), n)
	}
}

// TestRunRootSetupFailure: a program that does not exist is audited as a
// setup failure.
func TestRunRootSetupFailure(t *testing.T) {
	terms, audit, _ := newTerms(t, nil)
	if _, err := terms.RunRoot(context.Background(), []string{"/nonexistent/prog"}, holding()); err == nil {
		t.Fatal("RunRoot of a missing program succeeded")
	}
	audit.waitFor(t, KindRootRefuse, EventSetupFailed)
}

// TestRunRootContextEnd: ctx's end kills the command and is returned.
func TestRunRootContextEnd(t *testing.T) {
	terms, audit, _ := newTerms(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan runResult, 1)
	go func() {
		res, err := terms.RunRoot(ctx, []string{"/bin/sleep", "30"}, holding())
		ch <- runResult{res, err, time.Now()}
	}()
	pid := startedPid(t, audit)
	cancel()
	r := waitRoot(t, ch)
	if r.err == nil || r.res.ExitCode != -1 {
		t.Fatalf("RunRoot = %+v, %v; want killed with ctx's error", r.res, r.err)
	}
	waitGone(t, pid)
}

// TestRunRootStopsAtGrantEnd: the watcher also wakes at the grant's end,
// not only on its 500 ms tick.
func TestRunRootStopsAtGrantEnd(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	fake := clock.NewFake(t0)
	terms, audit, _ := newTerms(t, func(c *Config) { c.Clock = fake })
	grant := func() (time.Time, bool) { return t0.Add(100 * time.Millisecond), true }
	ch := startRoot(terms, []string{"/bin/sleep", "30"}, grant)
	startedPid(t, audit)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := fake.BlockUntil(ctx, 2); err != nil {
		t.Fatal(err)
	}
	fake.Advance(100 * time.Millisecond) // before the first tick
	if r := waitRoot(t, ch); r.res.Stopped != StoppedExpired {
		t.Fatalf("RunRoot = %+v, %v; want stopped %s", r.res, r.err, StoppedExpired)
	}
}

// processWith returns the pid of a process whose argv is exactly argv (0
// when none).
func processWith(argv ...string) int {
	want := strings.Join(argv, "\x00") + "\x00"
	ds, _ := os.ReadDir("/proc")
	for _, d := range ds {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile("/proc/" + d.Name() + "/cmdline"); err == nil && string(b) == want && alive(pid) {
			return pid
		}
	}
	return 0
}

// TestRunRootSetsidDoesNotOutliveRevoke: a process the root command
// started in a new session (out of its process group) is stopped with it
// at a revoke: the command runs in its own PID namespace. Needs real root.
func TestRunRootSetsidDoesNotOutliveRevoke(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("BC_REQUIRE_ROOT") == "1" {
			t.Fatal("BC_REQUIRE_ROOT=1 but not root")
		}
		t.Skip("a PID namespace needs root")
	}
	terms, audit, _ := newTerms(t, nil)
	var revoked atomic.Bool
	grant := func() (time.Time, bool) { return time.Now().Add(time.Hour), !revoked.Load() }
	ch := startRoot(terms, []string{"/bin/sh", "-c", "setsid /bin/sleep 313.25 & exec /bin/sleep 30"}, grant)
	startedPid(t, audit)
	deadline := time.Now().Add(5 * time.Second)
	for processWith("/bin/sleep", "313.25") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the setsid child did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}
	revokedAt := time.Now()
	revoked.Store(true)
	waitRoot(t, ch)
	for processWith("/bin/sleep", "313.25") != 0 {
		if time.Since(revokedAt) > 2*time.Second {
			t.Fatal("a process the root command started with setsid outlived the revoke by 2 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
