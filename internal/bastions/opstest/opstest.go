// Package opstest is a stand-in for a bastion's ops server in the control
// plane's tests (the machine's side is internal/bastion, not the control
// plane's): a real HTTP/1.1 server on loopback that parses each request as
// the issue 19 wire says and answers fixed JSON. It is also an OpsDialer
// (bastions.Service.SetOpsDialer) that dials it.
package opstest

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"
)

// Approval is the approval request id the stand-in asks for, and takes.
const Approval = "apr_abcdefghijklmnopqrst"

// Prompt is what a terminal sends first, with its 101.
const Prompt = "$ "

// Server is the stand-in. Ops: observe:disk answers a result; files:*
// asks for approval (Approval) until the op carries it, then answers a
// result; any other kind is refused ACCESS_DENIED with reason "excluded"
// and a message the control plane must not pass on. A terminal asks for
// approval until it carries Approval, then answers 101, sends Prompt and
// echoes every line until a line "exit".
type Server struct{ ln net.Listener }

var (
	opIDRE    = regexp.MustCompile(`^op_[a-z2-7]{26}$`)
	sessionRE = regexp.MustCompile(`^ts_[a-z2-7]{20}$`)
)

// Start starts a stand-in, stopped at t's end.
func Start(t testing.TB) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(serve), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return &Server{ln: ln}
}

// DialOps dials the stand-in, whatever the bastion.
func (s *Server) DialOps(ctx context.Context, _ string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", s.ln.Addr().String())
}

func answer(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, body)
}

const approvalAnswer = `{"ok":false,"code":"APPROVAL_REQUIRED","reason":"approval-required","message":"m","approval_request":"` + Approval +
	`","approval_expires":"2026-12-02T10:05:00Z","summary":"move a to b"}`

func serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/terminal" {
		serveTerminal(w, r)
		return
	}
	var op struct {
		OpID     string          `json:"op_id"`
		Kind     string          `json:"kind"`
		Args     json.RawMessage `json:"args"`
		Approval string          `json:"approval"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 300<<10))
	dec.DisallowUnknownFields()
	if r.Method != http.MethodPost || r.URL.Path != "/v1/op" || dec.Decode(&op) != nil || !opIDRE.MatchString(op.OpID) || len(op.Args) == 0 || op.Args[0] != '{' {
		answer(w, 400, `{"ok":false,"code":"INVALID_INPUT","reason":"malformed"}`)
		return
	}
	switch {
	case op.Kind == "observe:disk":
		answer(w, 200, `{"ok":true,"kind":"observe:disk","result":{"filesystems":[]}}`)
	case strings.HasPrefix(op.Kind, "files:") && op.Approval != Approval:
		answer(w, 409, approvalAnswer)
	case strings.HasPrefix(op.Kind, "files:"):
		answer(w, 200, `{"ok":true,"kind":"`+op.Kind+`","result":{"moved":[]}}`)
	default:
		answer(w, 403, `{"ok":false,"code":"ACCESS_DENIED","reason":"excluded","message":"/home/person/secret"}`)
	}
}

func serveTerminal(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if r.Method != http.MethodGet || r.Header.Get("Upgrade") != "bc-term-v1" || !sessionRE.MatchString(q.Get("session")) || q.Get("root") != "0" && q.Get("root") != "1" { // archtest:not-tenant (the query's root flag)
		answer(w, 400, `{"ok":false,"code":"INVALID_INPUT","reason":"malformed"}`)
		return
	}
	if q.Get("approval") != Approval {
		answer(w, 409, approvalAnswer)
		return
	}
	conn, rw, err := w.(http.Hijacker).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: bc-term-v1\r\nConnection: Upgrade\r\n\r\n" + Prompt)
	_ = rw.Flush()
	// Like a shell: each line echoed; "exit" (or the end) ends it.
	for {
		line, err := rw.ReadString('\n')
		if line == "exit\n" || err != nil {
			return
		}
		if _, err := io.WriteString(conn, line); err != nil {
			return
		}
	}
}
