package sandbox

import (
	"context"
	"errors"

	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// Sheller is a runtime that runs interactive processes on a terminal.
type Sheller interface {
	// Shell starts argv with env in sandbox id on a terminal; ctx ending
	// kills it.
	Shell(ctx context.Context, id string, argv, env []string, root bool) (driver.Shell, error)
}

// OpenShell starts argv on a terminal in sandboxID, as Exec runs a
// program (the same environment, user and limits), for an exec tunnel
// the node verified: the sandbox must be running here and not past its
// deadline (driver.ErrSandboxGone), and its runtime must have interactive
// execs (driver.ErrShellUnsupported). The process is killed at the
// sandbox's deadline or when ctx ends.
func (h *Host) OpenShell(ctx context.Context, sandboxID string, argv []string) (driver.Shell, error) {
	p, err := h.programFor(sandboxID)
	if err != nil {
		return nil, driver.ErrSandboxGone
	}
	if p.unresolved != "" {
		// An interactive exec names no env references: after a bcd
		// restart it stays refused until an exec resolved the values.
		return nil, errors.New(p.unresolved)
	}
	sh, ok := p.rt.(Sheller)
	if !ok {
		return nil, driver.ErrShellUnsupported
	}
	env, root, left := p.env, p.root, p.left
	sctx, cancel := context.WithTimeout(ctx, left)
	s, err := sh.Shell(sctx, sandboxID, argv, append([]string{"TERM=xterm"}, env...), root)
	if err != nil {
		cancel()
		if errors.Is(err, driver.ErrSandboxGone) {
			return nil, err
		}
		h.cfg.Log.Warn("sandbox shell failed", "sandbox_id", sandboxID, "err", err)
		return nil, err
	}
	return &cancelShell{Shell: s, cancel: cancel}, nil
}

// cancelShell releases the shell's deadline context when it is closed.
type cancelShell struct {
	driver.Shell
	cancel context.CancelFunc
}

func (c *cancelShell) Close() error {
	err := c.Shell.Close()
	c.cancel()
	return err
}

// Shells returns how many interactive processes the host's simulated
// runtime (when it has one) has alive and a channel told of each change; ok is false on a
// real runtime (tests of the sim runtime wait on it).
func (h *Host) Shells() (n int, changed <-chan int, ok bool) {
	sim, isSim := h.rts[spec.RuntimeSim].(*Sim)
	if !isSim {
		return 0, nil, false
	}
	n, changed = sim.Shells()
	return n, changed, true
}
