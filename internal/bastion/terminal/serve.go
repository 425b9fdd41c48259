package terminal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"

	"github.com/creack/pty"
)

// errConnClosed ends a session whose connection closed or failed.
var errConnClosed = errors.New("terminal: connection closed")

// errShellOutputEnded ends a session whose PTY output ended.
var errShellOutputEnded = errors.New("terminal: shell output ended")

// validSession reports whether id is 1 to 64 ASCII letters, digits, '_'
// or '-' (the wire's "ts_" + 20 base32 is one), so that it is safe in a
// file name and an audit line.
func validSession(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range []byte(id) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
		if !ok {
			return false
		}
	}
	return true
}

// Serve runs one terminal session on conn and closes conn before it
// returns. A malformed session id is refused (ReasonBadSession, not
// audited); a root terminal while the bastion is not root is refused
// (ReasonNotRoot, audited) before anything starts. Otherwise it starts the
// shell on a PTY as this process's user, in its own session, with a
// minimal environment and HOME as its working directory, and copies conn
// to the PTY and the PTY to conn, writing every output byte and each chunk
// of input (as a marked line) to the session's transcript. When the shell
// exits, its output is drained and conn closed; when conn closes or ctx
// ends, every process in the shell's session is killed and the shell
// reaped. It audits the open and the close (exit code, bytes) and returns
// nil on a normal end, or the transcript's failure, which ends the
// session.
func (t *Terminals) Serve(ctx context.Context, conn io.ReadWriteCloser, sessionID string, root bool) error {
	defer conn.Close()
	if !validSession(sessionID) {
		return &RefusedError{Reason: ReasonBadSession, Detail: "the session id is malformed"}
	}
	who := "session " + sessionID + " root " + strconv.FormatBool(root)
	if root && !t.isRoot() {
		return t.refuse(KindTerminalRefuse, ReasonNotRoot, "a root terminal needs the bastion to run as root", who)
	}
	tr, err := t.openTranscript("term", sessionID)
	if err != nil {
		t.audit(KindTerminalRefuse, EventSetupFailed, who+": no transcript")
		return err
	}
	defer tr.close()
	err = tr.line(t.clock.Now(), "terminal "+who+" shell "+strconv.Quote(t.shell))
	cmd := exec.Command(t.shell)
	cmd.Env = t.env("TERM=xterm-256color", "SHELL="+t.shell)
	cmd.Dir = t.home
	var ptmx *os.File
	if err == nil {
		// SysProcAttr is nil, so the shell gets its own session with the
		// PTY as its controlling terminal (Setsid, Setctty).
		ptmx, err = pty.StartWithSize(cmd, &pty.Winsize{Rows: 24, Cols: 80})
	}
	if err != nil {
		t.audit(KindTerminalRefuse, EventSetupFailed, who+" transcript "+tr.name)
		return fmt.Errorf("terminal: start shell: %w", err)
	}
	defer ptmx.Close()
	t.audit(KindTerminal, EventOpen, who+" transcript "+tr.name+" pid "+strconv.Itoa(cmd.Process.Pid))
	t.log.Info("terminal: opened", "session", sessionID, "root_terminal", root)
	s := &session{t: t, conn: conn, ptmx: ptmx, cmd: cmd, tr: tr}
	cause := s.run(ctx)
	code := cmd.ProcessState.ExitCode()
	_ = tr.line(t.clock.Now(), fmt.Sprintf("end exit %d out %d in %d", code, s.out.Load(), s.in.Load()))
	t.audit(KindTerminal, EventClose, fmt.Sprintf("session %s exit %d out %d in %d", sessionID, code, s.out.Load(), s.in.Load()))
	t.log.Info("terminal: closed", "session", sessionID, "exit", code)
	if errors.Is(cause, errTranscript) {
		return cause
	}
	return nil
}
