package terminal

import (
	"context"
	"io"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

const testSession = "ts_abcdefghijklmnopqrst"

// startServe runs Serve on one end of a pipe and returns the other end,
// the client's reader and the channel Serve's result arrives on.
func startServe(t *testing.T, terms *Terminals, ctx context.Context, root bool) (net.Conn, *output, chan error) {
	t.Helper()
	server, client := net.Pipe()
	t.Cleanup(func() { client.Close() })
	done := make(chan error, 1)
	go func() { done <- terms.Serve(ctx, server, testSession, root) }()
	return client, readAll(client), done
}

func waitServe(t *testing.T, done chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
		return nil
	}
}

func typeIn(t *testing.T, c net.Conn, s string) {
	t.Helper()
	_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, s); err != nil {
		t.Fatalf("type: %v", err)
	}
}

// TestServeRecordsSession: typed commands run, the output reaches the
// client and the transcript, the input is recorded, the shell's exit
// closes the connection, and the open and close are audited.
func TestServeRecordsSession(t *testing.T) {
	terms, audit, dir := newTerms(t, nil)
	client, out, done := startServe(t, terms, context.Background(), false)
	typeIn(t, client, "printf 'A%sZ\\n' marker; exit 3\n")
	if err := waitServe(t, done); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	<-out.done // the connection was closed
	if !strings.Contains(out.String(), "AmarkerZ") {
		t.Errorf("client output %q lacks the command's output", out.String())
	}
	tr := onlyTranscript(t, dir)
	if !strings.Contains(tr, "AmarkerZ") {
		t.Errorf("transcript lacks the output: %q", tr)
	}
	if want := `] in "printf 'A%sZ\\n' marker; exit 3\n"`; !strings.Contains(tr, want) {
		t.Errorf("transcript lacks the input record %s: %q", want, tr)
	}
	open := audit.waitFor(t, KindTerminal, EventOpen)
	name := transcripts(t, dir)[0]
	if !strings.Contains(open.detail, "session "+testSession) || !strings.Contains(open.detail, name[strings.LastIndexByte(name, '/')+1:]) {
		t.Errorf("open audit %q lacks the session or the transcript", open.detail)
	}
	if c := audit.waitFor(t, KindTerminal, EventClose); !strings.Contains(c.detail, "exit 3 ") {
		t.Errorf("close audit %q lacks exit 3", c.detail)
	}
}

var (
	shellPID = regexp.MustCompile(`pid=(\d+)`)
	jobPID   = regexp.MustCompile(`bg=(\d+)`)
)

// startShellWithJob starts a session whose shell runs a background job,
// and returns the shell's and the job's pids.
func startShellWithJob(t *testing.T, terms *Terminals, ctx context.Context) (net.Conn, chan error, int, int) {
	t.Helper()
	client, out, done := startServe(t, terms, ctx, false)
	typeIn(t, client, "echo pid=$$; /bin/sleep 300 & echo bg=$!\n")
	shell, _ := strconv.Atoi(out.waitMatch(t, shellPID))
	job, _ := strconv.Atoi(out.waitMatch(t, jobPID))
	if !alive(shell) || !alive(job) {
		t.Fatalf("shell %d or job %d not running", shell, job)
	}
	return client, done, shell, job
}

// TestServeConnCloseKillsShell: closing the connection kills the shell
// and its background job.
func TestServeConnCloseKillsShell(t *testing.T) {
	terms, audit, _ := newTerms(t, nil)
	client, done, shell, job := startShellWithJob(t, terms, context.Background())
	client.Close()
	if err := waitServe(t, done); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	waitGone(t, shell)
	waitGone(t, job)
	if c := audit.waitFor(t, KindTerminal, EventClose); !strings.Contains(c.detail, "exit -1 ") {
		t.Errorf("close audit %q, want exit -1 (killed)", c.detail)
	}
}

// TestServeContextEndKillsShell: ctx's end kills the shell and its job
// and closes the connection.
func TestServeContextEndKillsShell(t *testing.T) {
	terms, _, _ := newTerms(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, done, shell, job := startShellWithJob(t, terms, ctx)
	cancel()
	if err := waitServe(t, done); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	waitGone(t, shell)
	waitGone(t, job)
}

// TestServeRefusals: a root terminal on a bastion not root is refused
// and audited, a malformed session id is refused without an audit line;
// neither starts a shell or a transcript, and both close the connection.
func TestServeRefusals(t *testing.T) {
	for _, tc := range []struct {
		name, session, reason string
		audited               bool
	}{
		{"root-not-root", testSession, ReasonNotRoot, true},
		{"bad-session", "ts_../../x", ReasonBadSession, false},
		{"empty-session", "", ReasonBadSession, false},
		{"long-session", strings.Repeat("a", 65), ReasonBadSession, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			terms, audit, dir := newTerms(t, func(c *Config) { c.IsRoot = func() bool { return false } })
			server, client := net.Pipe()
			defer client.Close()
			out := readAll(client)
			done := make(chan error, 1)
			go func() { done <- terms.Serve(context.Background(), server, tc.session, true) }()
			var err error
			select {
			case err = <-done:
			case <-time.After(5 * time.Second):
				client.Close() // a shell was started: end it, then fail
				<-done
				t.Fatal("Serve started a session instead of refusing")
			}
			wantRefusal(t, err, tc.reason)
			<-out.done
			if n := len(transcripts(t, dir)); n != 0 {
				t.Errorf("%d transcripts, want none", n)
			}
			_, got := audit.find(KindTerminalRefuse, tc.reason)
			if got != tc.audited || len(audit.all()) != map[bool]int{true: 1, false: 0}[tc.audited] {
				t.Errorf("audit = %v, want audited %v", audit.all(), tc.audited)
			}
		})
	}
}

// TestServeRootTerminalWhenRoot: a root terminal on a root bastion opens.
func TestServeRootTerminalWhenRoot(t *testing.T) {
	terms, audit, _ := newTerms(t, nil)
	client, _, done := startServe(t, terms, context.Background(), true)
	typeIn(t, client, "exit 0\n")
	if err := waitServe(t, done); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if e := audit.waitFor(t, KindTerminal, EventOpen); !strings.Contains(e.detail, "root true") {
		t.Errorf("open audit %q lacks root true", e.detail)
	}
}
