package bastions_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/bastions"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// fakeOps stands in for a bastion's ops server (the boundary this module
// does not own): a real HTTP/1.1 server on loopback that parses each
// request as the wire says and answers fixed JSON per kind. It is also the
// OpsDialer, counting dials.
type fakeOps struct {
	t     *testing.T
	ln    net.Listener
	dials atomic.Int32
	mu    sync.Mutex
	ops   []map[string]any // the ops received, in order
}

const testApproval = "apr_abcdefghijklmnopqrst"

var opIDRE = regexp.MustCompile(`^op_[a-z2-7]{26}$`)

func newFakeOps(t *testing.T) *fakeOps {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeOps{t: t, ln: ln}
	srv := &http.Server{Handler: f, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return f
}

func (f *fakeOps) DialOps(ctx context.Context, _ string) (net.Conn, error) {
	f.dials.Add(1)
	var d net.Dialer
	return d.DialContext(ctx, "tcp", f.ln.Addr().String())
}

// answers are the fixed answers by kind: HTTP status and body.
var answers = map[string]struct {
	status int
	body   string
}{
	"observe:disk":          {200, `{"ok":true,"kind":"observe:disk","result":{"filesystems":[{"path":"/","total_bytes":10,"free_bytes":4}]}}`},
	"files:move-plan":       {409, `{"ok":false,"code":"APPROVAL_REQUIRED","reason":"approval-required","message":"m","approval_request":"` + testApproval + `","approval_expires":"2026-12-02T10:05:00Z","summary":"move a to b"}`},
	"test:invalid":          {400, `{"ok":false,"code":"INVALID_INPUT","reason":"unknown-kind","message":"the bastion knows no such kind"}`},
	"test:denied":           {403, `{"ok":false,"code":"ACCESS_DENIED","reason":"excluded","message":"x"}`},
	"test:missing":          {404, `{"ok":false,"code":"NOT_FOUND","reason":"no-such-share","message":"x"}`},
	"test:odd-reason":       {400, `{"ok":false,"code":"INVALID_INPUT","reason":"Bad Reason\u001b[31m","message":"x"}`},
	"test:mismatch":         {400, `{"ok":false,"code":"ACCESS_DENIED","reason":"excluded"}`},
	"test:other-code":       {409, `{"ok":false,"code":"CONFLICT","reason":"busy"}`},
	"test:bad-approval":     {409, `{"ok":false,"code":"APPROVAL_REQUIRED","approval_request":"apr_../../x","approval_expires":"2026-12-02T10:05:00Z"}`},
	"test:garbage":          {200, `not json`},
	"test:other-kind":       {200, `{"ok":true,"kind":"observe:disk","result":{}}`},
	"test:ok-not-ok-status": {500, `{"ok":true,"kind":"test:ok-not-ok-status","result":{}}`},
}

func (f *fakeOps) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == bastions.TerminalPath {
		f.serveTerminal(w, r)
		return
	}
	var op struct {
		OpID     string          `json:"op_id"`
		Kind     string          `json:"kind"`
		Args     json.RawMessage `json:"args"`
		Approval string          `json:"approval"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 256<<10+1024))
	dec.DisallowUnknownFields()
	if r.Method != http.MethodPost || r.URL.Path != bastions.OpsPath || r.Header.Get("Content-Type") != "application/json" ||
		dec.Decode(&op) != nil || !opIDRE.MatchString(op.OpID) || len(op.Args) == 0 || op.Args[0] != '{' {
		http.Error(w, `{"ok":false,"code":"INVALID_INPUT","reason":"malformed"}`, http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.ops = append(f.ops, map[string]any{"op_id": op.OpID, "kind": op.Kind, "args": string(op.Args), "approval": op.Approval})
	f.mu.Unlock()
	switch op.Kind {
	case "test:hang":
		<-r.Context().Done()
		return
	case "test:huge":
		w.WriteHeader(200)
		_, _ = w.Write([]byte(`{"ok":true,"kind":"test:huge","result":"` + strings.Repeat("a", bastions.MaxOpAnswer) + `"}`))
		return
	case "files:move-plan":
		if op.Approval == testApproval {
			_, _ = w.Write([]byte(`{"ok":true,"kind":"files:move-plan","result":{"moved":[{"from":"a","to":"b"}]}}`))
			return
		}
	}
	a, ok := answers[op.Kind]
	if !ok {
		a = answers["test:invalid"]
	}
	w.WriteHeader(a.status)
	_, _ = w.Write([]byte(a.body))
}

// serveTerminal answers a terminal request: APPROVAL_REQUIRED without an
// approval, else 101 and an echo of every byte after "hello\n".
func (f *fakeOps) serveTerminal(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if r.Method != http.MethodGet || r.Header.Get("Upgrade") != bastions.TerminalProtocol || !strings.EqualFold(r.Header.Get("Connection"), "upgrade") ||
		!regexp.MustCompile(`^ts_[a-z2-7]{20}$`).MatchString(q.Get("session")) || q.Get("root") != "0" && q.Get("root") != "1" {
		w.WriteHeader(400)
		_, _ = w.Write([]byte(`{"ok":false,"code":"INVALID_INPUT","reason":"malformed"}`))
		return
	}
	if q.Get("approval") != testApproval {
		w.WriteHeader(409)
		_, _ = w.Write([]byte(`{"ok":false,"code":"APPROVAL_REQUIRED","reason":"approval-required","approval_request":"` + testApproval + `","approval_expires":"2026-12-02T10:05:00Z","summary":"terminal"}`))
		return
	}
	conn, rw, err := w.(http.Hijacker).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	// The greeting goes out with the 101, in one write, so the control
	// plane's reader holds it in its buffer.
	_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: bc-term-v1\r\nConnection: Upgrade\r\n\r\nhello root=" + q.Get("root") + "\n")
	_ = rw.Flush()
	_, _ = io.Copy(conn, rw)
}

// received returns the ops the fake received.
func (f *fakeOps) received() []map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]map[string]any(nil), f.ops...)
}

// TestOpAnswerMapping: each answer of the bastion maps as the wire says:
// done with the result, approval-required (not an error) and then done with
// the approval, each refusal code to its own code and message naming the
// bastion's reason ("unknown" when it is not kebab-case), and anything else
// (a code at the wrong status, an unknown code, a malformed approval
// request, a body that is not JSON, a result of another kind, an answer
// over 8 MiB) UNAVAILABLE. Each op carries a fresh op_ id.
func TestOpAnswerMapping(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := newEnv(t, db)
		id, _ := e.pair(e.tenant, "desk")
		f := newFakeOps(t)
		e.s.SetOpsDialer(f)
		scope := iam.ScopeOf(e.tenant)
		a, err := e.s.Op(e.ctx, actor(e.tenant), scope, id, "observe:disk", json.RawMessage(`{}`), "")
		if err != nil || a.Status != bastions.OpDone || a.Kind != "observe:disk" || !opIDRE.MatchString(a.OpID) || !strings.Contains(string(a.Result), `"free_bytes":4`) {
			t.Fatalf("observe:disk: %+v %v", a, err)
		}
		args := json.RawMessage(`{"share":"sh_x","moves":[{"from":"a","to":"b"}]}`)
		a, err = e.s.Op(e.ctx, actor(e.tenant), scope, id, "files:move-plan", args, "")
		if err != nil || a.Status != bastions.OpApprovalRequired || a.ApprovalRequest != testApproval || a.Summary != "move a to b" ||
			a.ApprovalExpires == nil || !a.ApprovalExpires.Equal(time.Date(2026, 12, 2, 10, 5, 0, 0, time.UTC)) || a.Result != nil {
			t.Fatalf("move-plan without approval: %+v %v", a, err)
		}
		a, err = e.s.Op(e.ctx, actor(e.tenant), scope, id, "files:move-plan", args, testApproval)
		if err != nil || a.Status != bastions.OpDone || !strings.Contains(string(a.Result), "moved") {
			t.Fatalf("move-plan with approval: %+v %v", a, err)
		}
		got := f.received()
		if len(got) != 3 || got[2]["approval"] != testApproval || got[2]["args"] != string(args) || got[0]["op_id"] == got[1]["op_id"] {
			t.Fatalf("the bastion received %v", got)
		}
		for _, c := range []struct {
			kind string
			code errs.Code
			msg  string
		}{
			{"test:invalid", errs.InvalidInput, "the bastion refused the op (unknown-kind)"},
			{"test:denied", errs.AccessDenied, "the bastion refused the op (excluded)"},
			{"test:missing", errs.NotFound, "the bastion refused the op (no-such-share)"},
			{"test:odd-reason", errs.InvalidInput, "the bastion refused the op (unknown)"},
			{"test:mismatch", errs.Unavailable, "the bastion did not answer the op"},
			{"test:other-code", errs.Unavailable, "the bastion did not answer the op"},
			{"test:bad-approval", errs.Unavailable, "the bastion did not answer the op"},
			{"test:garbage", errs.Unavailable, "the bastion did not answer the op"},
			{"test:other-kind", errs.Unavailable, "the bastion did not answer the op"},
			{"test:ok-not-ok-status", errs.Unavailable, "the bastion did not answer the op"},
			{"test:huge", errs.Unavailable, "the bastion did not answer the op"},
		} {
			_, err := e.s.Op(e.ctx, actor(e.tenant), scope, id, c.kind, json.RawMessage(`{}`), "")
			if errs.CodeOf(err) != c.code || errs.SafeMessage(err) != c.msg {
				t.Errorf("%s: %v, want %s %q", c.kind, err, c.code, c.msg)
			}
		}
	})
}

// TestOpRefusedBeforeDialling: a malformed kind, arguments that are not
// one JSON object of at most 256 KiB and a malformed approval id are
// INVALID_INPUT with their reason; another tenant's bastion answers as a
// missing one (NOT_FOUND, byte for byte); an unpaired one is INVALID_STATE;
// without the lanes role UNAVAILABLE. None of them dials, none writes an
// audit row.
func TestOpRefusedBeforeDialling(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := newEnv(t, db)
		id, _ := e.pair(e.tenant, "desk")
		other, _ := e.pair(iam.RootTenant, "theirs")
		scope := iam.ScopeOf(e.tenant)
		_, err := e.s.Op(e.ctx, actor(e.tenant), scope, id, "observe:disk", json.RawMessage(`{}`), "")
		if errs.CodeOf(err) != errs.Unavailable || errs.SafeMessage(err) != "this process does not run the lanes role" {
			t.Fatalf("without the lanes role: %v", err)
		}
		f := newFakeOps(t)
		e.s.SetOpsDialer(f)
		big := json.RawMessage(`{"a":"` + strings.Repeat("x", bastions.MaxOpArgs) + `"}`)
		for _, c := range []struct {
			kind, args, approval, reason string
		}{
			{"observe", `{}`, "", bastions.ReasonOpKind},
			{"Observe:disk", `{}`, "", bastions.ReasonOpKind},
			{"observe:disk;rm", `{}`, "", bastions.ReasonOpKind},
			{"a:" + strings.Repeat("b", 63), `{}`, "", bastions.ReasonOpKind},
			{"observe:disk", `[]`, "", bastions.ReasonOpArgs},
			{"observe:disk", `"x"`, "", bastions.ReasonOpArgs},
			{"observe:disk", `{"a":`, "", bastions.ReasonOpArgs},
			{"observe:disk", ``, "", bastions.ReasonOpArgs},
			{"observe:disk", string(big), "", bastions.ReasonOpArgs},
			{"observe:disk", `{}`, "apr_short", bastions.ReasonApprovalID},
			{"observe:disk", `{}`, "apr_ABCDEFGHIJKLMNOPQRST", bastions.ReasonApprovalID},
		} {
			_, err := e.s.Op(e.ctx, actor(e.tenant), scope, id, c.kind, json.RawMessage(c.args), c.approval)
			wantRefusal(t, fmt.Sprintf("%q %.20q %q", c.kind, c.args, c.approval), err, errs.InvalidInput, c.reason)
		}
		var shapes []string
		for _, b := range []string{other, "nmissingxxxxxxxx"} {
			_, err := e.s.Op(e.ctx, actor(e.tenant), scope, b, "observe:disk", json.RawMessage(`{}`), "")
			shapes = append(shapes, fmt.Sprintf("%s %s", errs.CodeOf(err), err))
		}
		if shapes[0] != shapes[1] || !strings.HasPrefix(shapes[0], "NOT_FOUND") {
			t.Fatalf("another tenant's bastion and a missing one: %q", shapes)
		}
		if err := e.s.Unpair(e.ctx, actor(e.tenant), scope, id); err != nil {
			t.Fatal(err)
		}
		_, err = e.s.Op(e.ctx, actor(e.tenant), scope, id, "observe:disk", json.RawMessage(`{}`), "")
		wantRefusal(t, "unpaired", err, errs.InvalidState, bastions.ReasonUnpaired)
		if n := f.dials.Load(); n != 0 {
			t.Fatalf("%d dials for refused ops", n)
		}
		if n := e.countAudit(e.tenant, "compute:bastions:op", ""); n != 0 {
			t.Fatalf("%d audit rows for refused ops", n)
		}
	})
}

// TestOpAudited: an op writes its request (allowed: op id, kind, the
// arguments' SHA-256, never the arguments) before it is sent, and its
// answer after: answered (done or approval-required), refused with the
// code, or failed.
func TestOpAudited(t *testing.T) {
	e := newEnv(t, storetest.NewTestSQLite(t))
	id, _ := e.pair(e.tenant, "desk")
	e.s.SetOpsDialer(newFakeOps(t))
	scope := iam.ScopeOf(e.tenant)
	secretish := json.RawMessage(`{"share":"sh_x","path":"diary-entry"}`)
	a, err := e.s.Op(e.ctx, actor(e.tenant), scope, id, "observe:disk", secretish, "")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = e.s.Op(e.ctx, actor(e.tenant), scope, id, "files:move-plan", json.RawMessage(`{}`), "")
	_, _ = e.s.Op(e.ctx, actor(e.tenant), scope, id, "test:denied", json.RawMessage(`{}`), "")
	_, _ = e.s.Op(e.ctx, actor(e.tenant), scope, id, "test:garbage", json.RawMessage(`{}`), "")
	rows, err := e.db.QueryContext(e.ctx, `SELECT outcome, details FROM audit_events WHERE tenant_id = $1 AND action = 'compute:bastions:op' AND resource = $2 ORDER BY seq`, e.tenant, "bastion/"+id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var outcome, details string
		if err := rows.Scan(&outcome, &details); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(details, "diary-entry") {
			t.Fatalf("the arguments are in the audit row: %s", details)
		}
		got = append(got, outcome+" "+details)
	}
	want := []string{`allowed {"approval":"","args_sha256":"`, `answered {"kind":"observe:disk","op_id":"` + a.OpID + `","status":"done"}`,
		`allowed `, `answered {"kind":"files:move-plan","op_id":"op_`, `allowed `, `refused {"code":"ACCESS_DENIED"`, `allowed `, `failed {"code":"UNAVAILABLE"`}
	if len(got) != len(want) {
		t.Fatalf("audit rows:\n%s", strings.Join(got, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Fatalf("audit row %d: %s, want prefix %s", i, got[i], want[i])
		}
	}
	if !strings.Contains(got[0], `"op_id":"`+a.OpID+`"`) || !strings.Contains(got[3], `"status":"approval-required"`) {
		t.Fatalf("audit rows:\n%s", strings.Join(got, "\n"))
	}
}

// TestOpTimesOut: a bastion that never answers is UNAVAILABLE once
// OpTimeout has passed on the module's clock.
func TestOpTimesOut(t *testing.T) {
	e := newEnv(t, storetest.NewTestSQLite(t))
	id, _ := e.pair(e.tenant, "desk")
	f := newFakeOps(t)
	e.s.SetOpsDialer(f)
	errc := make(chan error, 1)
	go func() {
		_, err := e.s.Op(e.ctx, actor(e.tenant), iam.ScopeOf(e.tenant), id, "test:hang", json.RawMessage(`{}`), "")
		errc <- err
	}()
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	if err := e.clk.BlockUntil(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// The op is sent and waits for its answer (polled, with a deadline).
	for len(f.received()) == 0 {
		if ctx.Err() != nil {
			t.Fatal("the op never reached the bastion")
		}
		runtime.Gosched()
	}
	e.clk.Advance(bastions.OpTimeout - time.Second)
	select {
	case err := <-errc:
		t.Fatalf("the op ended before its timeout: %v", err)
	default:
	}
	e.clk.Advance(time.Second)
	select {
	case err := <-errc:
		if errs.CodeOf(err) != errs.Unavailable || errs.SafeMessage(err) != "the bastion did not answer the op" {
			t.Fatalf("hung op: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the op did not end at its timeout")
	}
}

// TestTerminalOpensAndSplices: a terminal without an approval is
// APPROVAL_REQUIRED naming the command to run on the machine; with it the
// connection is upgraded and carries bytes both ways, the first of which
// came with the 101. A malformed session or approval id is refused before
// dialling. Each request and answer is audited.
func TestTerminalOpensAndSplices(t *testing.T) {
	e := newEnv(t, storetest.NewTestSQLite(t))
	id, _ := e.pair(e.tenant, "desk")
	f := newFakeOps(t)
	e.s.SetOpsDialer(f)
	scope := iam.ScopeOf(e.tenant)
	session := "ts_abcdefghijklmnopqrst"
	for _, bad := range []bastions.TerminalRequest{{Session: "ts_short"}, {Session: ""}, {Session: session, Approval: "apr_x"}} {
		_, err := e.s.OpenTerminal(e.ctx, actor(e.tenant), scope, id, bad)
		if errs.CodeOf(err) != errs.InvalidInput {
			t.Fatalf("%+v: %v", bad, err)
		}
	}
	if n := f.dials.Load(); n != 0 {
		t.Fatalf("%d dials for malformed requests", n)
	}
	_, err := e.s.OpenTerminal(e.ctx, actor(e.tenant), scope, id, bastions.TerminalRequest{Session: session, Root: true})
	want := "the bastion asks its person: run `bcd bastion approve " + testApproval + "` on that machine, then repeat with --session " + session + " --approval " + testApproval
	if errs.CodeOf(err) != errs.ApprovalRequired || errs.SafeMessage(err) != want {
		t.Fatalf("terminal without approval: %v", err)
	}
	c, err := e.s.OpenTerminal(e.ctx, actor(e.tenant), scope, id, bastions.TerminalRequest{Session: session, Root: true, Approval: testApproval})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	if line, err := br.ReadString('\n'); err != nil || line != "hello root=1\n" {
		t.Fatalf("greeting %q %v", line, err)
	}
	if _, err := c.Write([]byte("ls\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := br.ReadString('\n'); err != nil || line != "ls\n" {
		t.Fatalf("echo %q %v", line, err)
	}
	if n := e.countAudit(e.tenant, "compute:bastions:terminal", "allowed"); n != 2 {
		t.Fatalf("%d terminal request rows", n)
	}
	if r, a := e.countAudit(e.tenant, "compute:bastions:terminal", "refused"), e.countAudit(e.tenant, "compute:bastions:terminal", "answered"); r != 1 || a != 1 {
		t.Fatalf("terminal answer rows: %d refused, %d answered", r, a)
	}
}
