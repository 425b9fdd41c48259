package terminal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
)

// errTranscript marks a session or command ended because its transcript
// could not be written.
var errTranscript = errors.New("terminal: transcript failed")

// session is one running terminal: the shell on ptmx and the connection.
type session struct {
	t    *Terminals
	conn io.ReadWriteCloser
	ptmx *os.File
	cmd  *exec.Cmd
	tr   *transcript
	out  atomic.Int64 // bytes from the PTY to conn
	in   atomic.Int64 // bytes from conn to the PTY
}

// run copies both ways until the shell exits, conn closes, ctx ends or the
// transcript fails; then it kills the shell's session, reaps the shell,
// drains its output (bounded by drainGrace), closes conn and waits for the
// conn reader (idem). It returns why the session ended.
func (s *session) run(ctx context.Context) error {
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	waited := make(chan struct{})
	go func() {
		_ = s.cmd.Wait()
		close(waited)
	}()
	outDone, inDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(outDone)
		cancel(s.copyOut())
	}()
	go func() {
		defer close(inDone)
		cancel(s.copyIn())
	}()
	select {
	case <-waited:
	case <-runCtx.Done():
	}
	killSession(s.cmd.Process.Pid)
	<-waited
	killSession(s.cmd.Process.Pid) // what the shell forked while it was killed
	s.wait(outDone)
	s.conn.Close()
	s.ptmx.Close()
	s.wait(inDone)
	cancel(errShellOutputEnded)
	return context.Cause(runCtx)
}

// wait waits for done, at most drainGrace.
func (s *session) wait(done <-chan struct{}) {
	timer := s.t.clock.NewTimer(drainGrace)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C():
	}
}

// copyOut copies the PTY's output to the transcript, then to conn, until
// either fails; it returns why it stopped.
func (s *session) copyOut() error {
	buf := make([]byte, 32<<10)
	for {
		n, err := s.ptmx.Read(buf)
		if n > 0 {
			if terr := s.tr.write(buf[:n]); terr != nil {
				return fmt.Errorf("%w: %w", errTranscript, terr)
			}
			if _, werr := s.conn.Write(buf[:n]); werr != nil {
				return errConnClosed
			}
			s.out.Add(int64(n))
		}
		if err != nil {
			return errShellOutputEnded
		}
	}
}

// copyIn copies conn to the PTY, recording each chunk in the transcript
// first as a marked, quoted line; it returns why it stopped.
func (s *session) copyIn() error {
	buf := make([]byte, 32<<10)
	for {
		n, err := s.conn.Read(buf)
		if n > 0 {
			if terr := s.tr.line(s.t.clock.Now(), "in "+strconv.Quote(string(buf[:n]))); terr != nil {
				return fmt.Errorf("%w: %w", errTranscript, terr)
			}
			if _, werr := s.ptmx.Write(buf[:n]); werr != nil {
				return errShellOutputEnded
			}
			s.in.Add(int64(n))
		}
		if err != nil {
			return errConnClosed
		}
	}
}
