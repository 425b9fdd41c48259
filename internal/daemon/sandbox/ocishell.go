package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/creack/pty"

	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// Shell runs argv in sandbox id on a terminal with `runc exec --process
// FILE`, the process's terminal set: runc makes the sandbox's terminal and
// copies it to and from its own standard streams, which are the slave of
// a pseudo-terminal bcd holds (github.com/creack/pty), so bcd reads and
// writes the master, and a size set on it reaches the sandbox (runc
// follows its terminal's SIGWINCH). The process's host pid (--pid-file)
// is what Close kills. gVisor's runsc is refused
// (driver.ErrShellUnsupported): its exec terminal is not wired here.
func (o *OCI) Shell(ctx context.Context, id string, argv, env []string, root bool) (driver.Shell, error) {
	if o.name != spec.RuntimeRunc {
		return nil, driver.ErrShellUnsupported
	}
	if err := spec.ValidSandboxID(id); err != nil {
		return nil, err
	}
	b := o.bundle(id)
	if _, err := os.Stat(b); err != nil {
		return nil, driver.ErrSandboxGone
	}
	inherited := o.hasUserNS(b)
	proc := processFor(argv, append([]string{defaultPath}, env...), root, inherited)
	proc.Terminal = true
	pf, err := processFile(proc)
	if err != nil {
		return nil, err
	}
	defer pf.Close() // runc holds it once started
	pidFile := filepath.Join(b, "shell-"+ids.New("x")+".pid")
	ptmx, tty, err := pty.Open()
	if err != nil {
		return nil, fmt.Errorf("sandbox: pseudo-terminal: %w", err)
	}
	_ = pty.Setsize(ptmx, &pty.Winsize{Cols: 80, Rows: 24})
	cmd := o.command(context.Background(), inherited, o.argv(nil, "exec", "--process", processFD, "--pid-file", pidFile, id))
	cmd.ExtraFiles = []*os.File{pf}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
	if err := cmd.Start(); err != nil {
		ptmx.Close()
		tty.Close()
		return nil, fmt.Errorf("sandbox: start shell: %w", err)
	}
	tty.Close() // runc holds it now
	s := &ociShell{ptmx: ptmx, cmd: cmd, pidFile: pidFile, done: make(chan struct{})}
	go func() {
		s.werr = cmd.Wait()
		close(s.done)
	}()
	go func() {
		select {
		case <-ctx.Done():
			_ = s.Close()
		case <-s.done:
		}
	}()
	return s, nil
}

// ociShell is a runc exec on a pseudo-terminal.
type ociShell struct {
	ptmx    *os.File
	cmd     *exec.Cmd
	pidFile string
	done    chan struct{}
	werr    error
	once    sync.Once
}

func (s *ociShell) Read(p []byte) (int, error) {
	n, err := s.ptmx.Read(p)
	if errors.Is(err, syscall.EIO) {
		// The terminal's last holder closed it: the process ended.
		err = errors.New("sandbox: shell ended")
	}
	return n, err
}

func (s *ociShell) Write(p []byte) (int, error) { return s.ptmx.Write(p) }

// Resize sets the pseudo-terminal's size; runc passes it on.
func (s *ociShell) Resize(cols, rows uint16) error {
	return pty.Setsize(s.ptmx, &pty.Winsize{Cols: cols, Rows: rows})
}

// Wait returns runc exec's status, which is the process's.
func (s *ociShell) Wait() (int, error) {
	<-s.done
	var ee *exec.ExitError
	switch {
	case s.werr == nil:
		return 0, nil
	case errors.As(s.werr, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal()), nil
		}
		return ee.ExitCode(), nil
	}
	return -1, s.werr
}

// Close kills the process in the sandbox (its host pid from runc's pid
// file), then runc, and releases the terminal.
func (s *ociShell) Close() error {
	s.once.Do(func() {
		select {
		case <-s.done: // ended on its own: its pid may be another's now
		default:
			if b, err := os.ReadFile(s.pidFile); err == nil {
				if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			_ = s.cmd.Process.Kill()
		}
		<-s.done
		_ = s.ptmx.Close()
		os.Remove(s.pidFile)
	})
	return nil
}
