package integration

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pquerna/otp/totp"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/bastion/agent"
	"github.com/bettercompute/bettercompute/internal/bastion/approval"
	"github.com/bettercompute/bettercompute/internal/bastion/share"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// opsBastion is a paired, running bastion with an enrolled factor whose
// secret the test holds (as the person's authenticator does).
type opsBastion struct {
	a      *agent.Agent
	st     *approval.Store
	secret string
	step   time.Time // the last step a code was made for
}

// enrolledBastion pairs a bastion and enrolls a second factor on it.
func enrolledBastion(t *testing.T, e *testenv.Env, cfg agent.Config) *opsBastion {
	t.Helper()
	a := pairBastionWith(t, e, cfg)
	st, err := agent.OpenApprovals(a.DataDir(), nil)
	if err != nil {
		t.Fatalf("open approvals: %v", err)
	}
	uri, err := st.Enroll("test")
	if err != nil {
		t.Fatalf("enroll: %v", err)
	}
	u, err := url.Parse(uri)
	if err != nil || u.Query().Get("secret") == "" {
		t.Fatalf("enroll URI %q: %v", uri, err)
	}
	return &opsBastion{a: a, st: st, secret: u.Query().Get("secret")}
}

// code is a fresh code: for the next 30 s step after the last one used
// (a code is accepted once, so each approval needs a later step; the
// store accepts one step ahead of its clock).
func (b *opsBastion) code(t *testing.T) string {
	t.Helper()
	now := time.Now().Truncate(30 * time.Second)
	if !now.After(b.step) {
		now = b.step.Add(30 * time.Second)
	}
	b.step = now
	c, err := totp.GenerateCode(b.secret, now)
	if err != nil {
		t.Fatalf("code: %v", err)
	}
	return c
}

// op sends one op through the control plane's API.
func op(t *testing.T, e *testenv.Env, id, kind, args, approvalID string) (apitypes.BastionOpAnswer, error) {
	t.Helper()
	var ans apitypes.BastionOpAnswer
	err := e.Client.Call(context.Background(), "bastions.op", apitypes.BastionOpIn{BastionID: id, Kind: kind, Args: json.RawMessage(args), Approval: approvalID}, &ans)
	return ans, err
}

// wantOpRefused asserts err is code with the bastion's reason.
func wantOpRefused(t *testing.T, what string, err error, code errs.Code, reason string) {
	t.Helper()
	var ae *client.Error
	if !errors.As(err, &ae) || ae.Code != string(code) || !strings.Contains(ae.Message, "("+reason+")") {
		t.Fatalf("%s: %v, want %s (%s)", what, err, code, reason)
	}
}

// mustOp sends an op that must be done.
func mustOp(t *testing.T, e *testenv.Env, id, kind, args, approvalID string) apitypes.BastionOpAnswer {
	t.Helper()
	ans, err := op(t, e, id, kind, args, approvalID)
	if err != nil || ans.Status != "done" {
		t.Fatalf("%s %s: %+v %v", kind, args, ans, err)
	}
	return ans
}

// sharedFolder makes a folder with a plain file, an excluded one, an
// .agent folder and a link out, and shares it excluding "secrets".
func sharedFolder(t *testing.T, dir string) share.Share {
	t.Helper()
	root := t.TempDir()
	for name, body := range map[string]string{"notes/todo.txt": "buy milk", "notes/secrets/key.txt": "hunter2",
		".agent/index.txt": "plaintext of every file", "old/report.txt": "q3"} {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc/hostname", filepath.Join(root, "notes", "out")); err != nil {
		t.Fatal(err)
	}
	s, err := share.Add(dir, root, []string{"secrets"}, time.Now())
	if err != nil {
		t.Fatalf("share: %v", err)
	}
	return s
}

// TestBastionOpsSharedFoldersAndApprovals pairs a bastion, enrolls a
// factor and shares a folder: a files:read of a shared file works; an
// excluded file, a path into .agent, a link out of the folder and a path
// with .. are refused by reason; a move plan waits for a code entered on
// the machine, runs once with it and archives (nothing deleted); the
// code used once is refused for the next request.
func TestBastionOpsSharedFoldersAndApprovals(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := bastionEnv(t, db)
		b := enrolledBastion(t, e, agent.Config{})
		id := b.a.ID()
		s := sharedFolder(t, b.a.DataDir())

		ans := mustOp(t, e, id, "files:read", `{"share":"`+s.ID+`","path":"notes/todo.txt"}`, "")
		var read struct {
			Data string `json:"data_base64"`
		}
		if err := json.Unmarshal(ans.Result, &read); err != nil {
			t.Fatal(err)
		}
		if got, _ := base64.StdEncoding.DecodeString(read.Data); string(got) != "buy milk" {
			t.Fatalf("files:read = %q", got)
		}
		for _, c := range []struct{ path, reason string }{{"notes/secrets/key.txt", "excluded"}, {".agent/index.txt", "agent-folder"},
			{"notes/out", "link-outside"}, {"notes/../../etc/passwd", "path-invalid"}} {
			_, err := op(t, e, id, "files:read", `{"share":"`+s.ID+`","path":"`+c.path+`"}`, "")
			wantOpRefused(t, "read "+c.path, err, errs.AccessDenied, c.reason)
		}

		// An action op's effects are held to the share's rules as the
		// file ops are, before the person is asked.
		for _, c := range []struct{ path, reason string }{{"notes/secrets/key.txt", "excluded"}, {".agent/index.txt", "agent-folder"},
			{"notes/out", "link-outside"}, {"notes/secrets/new.txt", "excluded"}} {
			args, _ := json.Marshal(map[string]any{"share": s.ID, "script": "true", "effects": []string{c.path}})
			_, err := op(t, e, id, "action:dry-run", string(args), "")
			wantOpRefused(t, "effect "+c.path, err, errs.AccessDenied, c.reason)
		}

		moves := `{"share":"` + s.ID + `","moves":[{"from":"old/report.txt","to":""}]}`
		pending := mustApprovalRequired(t, e, id, "files:move-plan", moves)
		code := b.code(t)
		if err := b.st.Approve(pending, code); err != nil {
			t.Fatalf("approve: %v", err)
		}
		ans = mustOp(t, e, id, "files:move-plan", moves, pending)
		archived := filepath.Join(s.Path, "Archive", time.Now().UTC().Format("2006-01-02"), "old", "report.txt")
		if got, err := os.ReadFile(archived); err != nil || string(got) != "q3" {
			t.Fatalf("archived file %s: %q %v (answer %s)", archived, got, err, ans.Result)
		}
		if _, err := os.Stat(filepath.Join(s.Path, "old", "report.txt")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the moved file is still in place: %v", err)
		}

		again := mustApprovalRequired(t, e, id, "files:move-plan", `{"share":"`+s.ID+`","moves":[{"from":"notes/todo.txt","to":""}]}`)
		wantStoreRefusal(t, "code reused", b.st.Approve(again, code), approval.ReasonCodeReused)
	})
}

// mustApprovalRequired sends an op that must wait for the person's
// approval and returns the pending request's id.
func mustApprovalRequired(t *testing.T, e *testenv.Env, id, kind, args string) string {
	t.Helper()
	ans, err := op(t, e, id, kind, args, "")
	if err != nil || ans.Status != "approval-required" || !strings.HasPrefix(ans.ApprovalRequest, "apr_") {
		t.Fatalf("%s without approval: %+v %v, want approval-required", kind, ans, err)
	}
	return ans.ApprovalRequest
}

// wantStoreRefusal asserts err is an approval refusal with reason.
func wantStoreRefusal(t *testing.T, what string, err error, reason string) {
	t.Helper()
	var r interface{ RefusalReason() string }
	if err == nil || !errors.As(err, &r) || r.RefusalReason() != reason {
		t.Fatalf("%s: %v, want reason %s", what, err, reason)
	}
}

// TestBastionOpsStandingGrantWindowRateAndSeal gives a standing grant
// for move plans of 3 runs an hour: three plans run with no approval,
// the 4th waits for the person. A tampered ops.json, then a record
// copied from another bastion, hold no grant.
func TestBastionOpsStandingGrantWindowRateAndSeal(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := bastionEnv(t, db)
		b := enrolledBastion(t, e, agent.Config{})
		other := enrolledBastion(t, e, agent.Config{})
		id := b.a.ID()
		s := sharedFolder(t, b.a.DataDir())
		for i := range 5 {
			if err := os.WriteFile(filepath.Join(s.Path, "old", fmt.Sprintf("f%d", i)), []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		now := time.Now()
		if _, err := b.st.GrantStanding("files:move-plan", now.Add(-time.Minute), now.Add(24*time.Hour), 3, 10, b.code(t)); err != nil {
			t.Fatalf("standing grant: %v", err)
		}
		move := func(i int) string { return fmt.Sprintf(`{"share":"%s","moves":[{"from":"old/f%d","to":""}]}`, s.ID, i) }
		for i := range 3 {
			mustOp(t, e, id, "files:move-plan", move(i), "")
		}
		mustApprovalRequired(t, e, id, "files:move-plan", move(3))

		// A record edited by hand holds no grant, nor one copied from
		// another bastion (sealed under its key and id).
		ops := filepath.Join(b.a.DataDir(), "ops.json")
		orig, err := os.ReadFile(ops)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.st.GrantStanding("files:move-plan", now.Add(-time.Minute), now.Add(24*time.Hour), 100, 100, other.code(t)); err != nil {
			t.Fatalf("other's standing grant: %v", err)
		}
		copied, err := os.ReadFile(filepath.Join(other.a.DataDir(), "ops.json"))
		if err != nil {
			t.Fatal(err)
		}
		tampered := strings.Replace(string(orig), `"sealed":"`, `"sealed":"AAAA`, 1)
		for name, body := range map[string]string{"edited": tampered, "copied from another bastion": string(copied)} {
			if err := os.WriteFile(ops, []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
			gs, err := b.st.ListStanding()
			if err != nil || len(gs) != 1 || gs[0].Valid {
				t.Fatalf("%s: ops list %+v %v, want one invalid record", name, gs, err)
			}
			mustApprovalRequired(t, e, id, "files:move-plan", move(4))
		}
	})
}

// TestBastionOpsActionDryRunHasNoNetwork runs an action op's dry run
// through the control plane: it needs the person's approval, runs with
// no network (a listener on this machine sees nothing), its approval is
// spent by that one run, and its apply
// lands exactly the change list shown, and only while the folder is
// shared. A destination on the LAN, as an address, is refused when the op
// arrives.
func TestBastionOpsActionDryRunHasNoNetwork(t *testing.T) {
	requireRuncForOps(t)
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := bastionEnv(t, db)
		b := enrolledBastion(t, e, agent.Config{})
		id := b.a.ID()
		s := sharedFolder(t, b.a.DataDir())
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		var reached atomic.Int32
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				reached.Add(1)
				c.Close()
			}
		}()
		port := ln.Addr().(*net.TCPAddr).Port
		script := fmt.Sprintf(`if wget -q -T 2 -O /dev/null http://127.0.0.1:%d/; then echo reached > /work/notes/net.txt; else echo no-network > /work/notes/net.txt; fi`, port)
		args, _ := json.Marshal(map[string]any{"share": s.ID, "script": script, "effects": []string{"notes/net.txt"}})
		apr := mustApprovalRequired(t, e, id, "action:dry-run", string(args))
		if err := b.st.Approve(apr, b.code(t)); err != nil {
			t.Fatalf("approve the dry run: %v", err)
		}
		ans := mustOp(t, e, id, "action:dry-run", string(args), apr)
		_, err = op(t, e, id, "action:dry-run", string(args), apr)
		wantOpRefused(t, "approval reused", err, errs.AccessDenied, approval.ReasonApprovalSpent)
		var plan struct {
			Plan, Digest string
			Changes      []struct{ Path, SHA256 string }
		}
		if err := json.Unmarshal(ans.Result, &plan); err != nil || len(plan.Changes) != 1 || plan.Changes[0].Path != "notes/net.txt" {
			t.Fatalf("dry run: %s %v", ans.Result, err)
		}
		if n := reached.Load(); n != 0 {
			t.Fatalf("the dry run reached a listener on this machine %d times", n)
		}
		if _, err := os.Stat(filepath.Join(s.Path, "notes", "net.txt")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the dry run changed the folder: %v", err)
		}
		apply := fmt.Sprintf(`{"plan":"%s","digest":"%s"}`, plan.Plan, plan.Digest)
		apr = mustApprovalRequired(t, e, id, "action:apply", apply)
		if err := b.st.Approve(apr, b.code(t)); err != nil {
			t.Fatalf("approve the apply: %v", err)
		}
		// A folder no longer shared takes no apply; shared again, it does.
		if err := share.Remove(b.a.DataDir(), s.ID); err != nil {
			t.Fatal(err)
		}
		_, err = op(t, e, id, "action:apply", apply, apr)
		wantOpRefused(t, "apply to a folder no longer shared", err, errs.NotFound, share.ReasonUnknownShare)
		if s, err = share.Add(b.a.DataDir(), s.Path, s.Excludes, time.Now()); err != nil {
			t.Fatal(err)
		}
		mustOp(t, e, id, "action:apply", apply, apr)
		if got, err := os.ReadFile(filepath.Join(s.Path, "notes", "net.txt")); err != nil || string(got) != "no-network\n" {
			t.Fatalf("applied file: %q %v, want no-network", got, err)
		}

		lan, _ := json.Marshal(map[string]any{"share": s.ID, "script": "true", "effects": []string{"notes/x"},
			"inputs": []map[string]string{{"url": "http://192.168.1.10/x", "as": "x"}}})
		_, err = op(t, e, id, "action:dry-run", string(lan), "")
		wantOpRefused(t, "a LAN destination", err, errs.AccessDenied, "destination-private")
	})
}

// requireRuncForOps skips unless this is root with runc, or fails under
// BC_REQUIRE_RUNC=1 (CI).
func requireRuncForOps(t *testing.T) {
	t.Helper()
	_, err := exec.LookPath("runc")
	if os.Geteuid() == 0 && err == nil {
		return
	}
	if os.Getenv("BC_REQUIRE_RUNC") == "1" {
		t.Fatal("BC_REQUIRE_RUNC=1 but not root with runc: action ops' dry runs need them")
	}
	t.Skip("action ops' dry runs need root and runc")
}

// TestBastionOpsRootCommandStopsOnRevoke gives the root command grant on
// the machine (root and a code), runs a long root command through the
// control plane, revokes the grant, and sees the command stopped within
// 2 s. Without the grant, root:run is refused.
func TestBastionOpsRootCommandStopsOnRevoke(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("BC_REQUIRE_ROOT") == "1" {
			t.Fatal("BC_REQUIRE_ROOT=1 but not root")
		}
		t.Skip("root commands need the bastion to run as root")
	}
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := bastionEnv(t, db)
		b := enrolledBastion(t, e, agent.Config{})
		id := b.a.ID()
		_, err := op(t, e, id, "root:run", `{"argv":["/bin/true"]}`, "")
		wantOpRefused(t, "no root grant", err, errs.AccessDenied, "no-root-grant")
		if err := b.st.GiveRootGrant(time.Now().Add(time.Hour), b.code(t)); err != nil {
			t.Fatalf("root grant: %v", err)
		}
		type result struct {
			ans apitypes.BastionOpAnswer
			err error
			at  time.Time
		}
		done := make(chan result, 1)
		go func() {
			ans, err := op(t, e, id, "root:run", `{"argv":["/bin/sleep","30"]}`, "")
			done <- result{ans, err, time.Now()}
		}()
		waitFor(t, "the root command to start", func() bool { return processRunning("/bin/sleep", "30") })
		revoked := time.Now()
		if err := b.st.RevokeRootGrant(); err != nil {
			t.Fatal(err)
		}
		var r result
		select {
		case r = <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the root command still runs 10 s after its grant was revoked")
		}
		var res struct{ Stopped string }
		if r.err != nil || json.Unmarshal(r.ans.Result, &res) != nil || res.Stopped != "grant-revoked" {
			t.Fatalf("root:run after revoke: %+v %v", r.ans, r.err)
		}
		if took := r.at.Sub(revoked); took > 2*time.Second {
			t.Fatalf("the root command stopped %v after the revoke, want within 2 s", took)
		}
	})
}

// processRunning reports whether a process runs with exactly argv.
func processRunning(argv ...string) bool {
	want := strings.Join(argv, "\x00") + "\x00"
	ds, _ := os.ReadDir("/proc")
	for _, d := range ds {
		b, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err == nil && string(b) == want {
			return true
		}
	}
	return false
}

// aprRE finds the approval request in a refusal's message.
var aprRE = regexp.MustCompile(`apr_[a-z2-7]{20}`)

// TestBastionOpsTerminalNeedsApprovalForItsSession asks for a terminal
// through the control plane: it is refused APPROVAL_REQUIRED naming a
// request; an approval for that session opens a PTY with the bastion
// user's shell once; the same approval for another session is refused,
// and the session is in the machine's transcripts.
func TestBastionOpsTerminalNeedsApprovalForItsSession(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := bastionEnv(t, db)
		b := enrolledBastion(t, e, agent.Config{Shell: "/bin/sh", IsRoot: func() bool { return false }})
		ctx := context.Background()
		session := client.NewTerminalSession()
		_, err := e.Client.BastionTerminal(ctx, b.a.ID(), session, false, "")
		var ae *client.Error
		if !errors.As(err, &ae) || ae.Code != "APPROVAL_REQUIRED" || !aprRE.MatchString(ae.Message) {
			t.Fatalf("terminal without approval: %v, want APPROVAL_REQUIRED naming a request", err)
		}
		apr := aprRE.FindString(ae.Message)
		if err := b.st.Approve(apr, b.code(t)); err != nil {
			t.Fatalf("approve: %v", err)
		}
		_, err = e.Client.BastionTerminal(ctx, b.a.ID(), client.NewTerminalSession(), false, apr)
		if !errors.As(err, &ae) || ae.Code != "ACCESS_DENIED" || !strings.Contains(ae.Message, "("+approval.ReasonApprovalMismatch+")") {
			t.Fatalf("another session with that approval: %v, want approval-mismatch", err)
		}
		_, err = e.Client.BastionTerminal(ctx, b.a.ID(), session, true, apr)
		if !errors.As(err, &ae) || !strings.Contains(ae.Message, "(not-root)") {
			t.Fatalf("a root terminal on a bastion not running as root: %v, want not-root", err)
		}
		conn, err := e.Client.BastionTerminal(ctx, b.a.ID(), session, false, apr)
		if err != nil {
			t.Fatalf("terminal with its approval: %v", err)
		}
		if _, err := io.WriteString(conn, "echo hi-$((6*7))\nexit\n"); err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(io.LimitReader(conn, 1<<20))
		conn.Close()
		if !strings.Contains(string(out), "hi-42") {
			t.Fatalf("terminal output %q, want hi-42", out)
		}
		ts, _ := filepath.Glob(filepath.Join(b.a.DataDir(), "transcripts", "*"))
		found := false
		for _, p := range ts {
			if body, _ := os.ReadFile(p); strings.Contains(string(body), "hi-42") {
				found = true
			}
		}
		if !found {
			t.Fatalf("no transcript among %v holds the session", ts)
		}
	})
}
