package driver

import (
	"context"
	"errors"
	"io"
)

// Shell is one interactive process on a terminal, started by a Shells
// driver for an exec tunnel: reads give what the terminal shows, writes
// are what is typed.
type Shell interface {
	io.ReadWriter
	// Resize sets the terminal's size in characters.
	Resize(cols, rows uint16) error
	// Wait waits for the process to end and returns its exit status
	// (128+n for a signal n).
	Wait() (int, error)
	// Close kills the process (what it started goes with its terminal)
	// and releases the terminal. It is safe to call more than once and
	// after Wait.
	Close() error
}

// Shells is a driver that runs interactive processes in sandboxes (the
// sandbox host's driver).
type Shells interface {
	// OpenShell starts argv (no shell added) in sandboxID on a terminal of
	// 80x24 until Resize, killed no later than the sandbox's deadline or
	// when ctx ends.
	OpenShell(ctx context.Context, sandboxID string, argv []string) (Shell, error)
}

// Errors of OpenShell, each a reason the node gives.
var (
	// ErrSandboxGone: the sandbox is not running on this host, failed, or
	// its deadline passed.
	ErrSandboxGone = errors.New("exec-sandbox-gone")
	// ErrShellUnsupported: the sandbox's runtime has no interactive exec.
	ErrShellUnsupported = errors.New("exec-unsupported")
)
