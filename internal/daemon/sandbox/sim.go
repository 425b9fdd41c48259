package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// Sim is a simulated runtime for tests that cannot run a real one: it
// keeps which sandboxes exist and answers a few programs (echo, true,
// false, hostname, env) from memory. Everything around it (signed specs,
// image fetch and digest check, state, deadlines) is the real code.
type Sim struct {
	mu  sync.Mutex
	sbx map[string]spec.Create
	// shells counts the simulated interactive processes alive; changed is
	// told of each change (tests wait on it, never sleep).
	shells  int
	changed chan int
	// dir holds each sandbox's (real, empty unless restored) writable
	// layer, dir/layers/<id>; OpenHost sets it under the host's
	// directory.
	dir string
}

// useDir sets the directory of the sandboxes' layers, once.
func (s *Sim) useDir(dir string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dir == "" {
		s.dir = dir
	}
}

// layer returns sandbox id's layer directory ("" without a directory).
func (s *Sim) layer(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dir == "" || spec.ValidSandboxID(id) != nil {
		return ""
	}
	return filepath.Join(s.dir, "layers", id)
}

// LayerDir returns sandbox id's writable layer: a real directory the
// host packs and restores like a real runtime's.
func (s *Sim) LayerDir(id string) (string, error) {
	if !s.Running(context.Background(), id) {
		return "", errors.New("sandbox-not-found")
	}
	d := s.layer(id)
	if d == "" {
		return "", errors.New("sim: no layer directory")
	}
	return d, nil
}

// Pause checks that the sandbox exists; simulated processes write nothing.
func (s *Sim) Pause(ctx context.Context, id string) error {
	_, err := s.LayerDir(id)
	return err
}

// Resume checks that the sandbox exists.
func (s *Sim) Resume(ctx context.Context, id string) error { return s.Pause(ctx, id) }

// NewSim returns an empty simulated runtime.
func NewSim() *Sim { return &Sim{sbx: map[string]spec.Create{}, changed: make(chan int, 64)} }

// Shells returns how many simulated interactive processes are alive, and
// a channel that receives the count after each change.
func (s *Sim) Shells() (int, <-chan int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.shells, s.changed
}

func (s *Sim) shellStarted() { s.shellDelta(1) }
func (s *Sim) shellEnded()   { s.shellDelta(-1) }

func (s *Sim) shellDelta(d int) {
	s.mu.Lock()
	s.shells += d
	n := s.shells
	s.mu.Unlock()
	select {
	case s.changed <- n:
	default:
	}
}

// Name returns "sim".
func (s *Sim) Name() string { return spec.RuntimeSim }

// Start makes the sandbox's layer directory, fills it from p.Restore
// (owned by this process, the simulated sandbox's user), and records the
// sandbox.
func (s *Sim) Start(_ context.Context, c spec.Create, p Placement) error {
	if d := s.layer(c.SandboxID); d != "" {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("sim: layer: %w", err)
		}
		if p.Restore != nil {
			if err := p.Restore(d, os.Getuid(), os.Getgid()); err != nil {
				return err
			}
		}
	} else if p.Restore != nil {
		return &reasonError{ReasonCheckpointUnavailable, errors.New("sim: no layer directory")}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sbx[c.SandboxID] = c
	return nil
}

// Exec answers argv from memory.
func (s *Sim) Exec(ctx context.Context, id string, argv, env []string, _ bool) (spec.ExecResult, error) {
	s.mu.Lock()
	_, ok := s.sbx[id]
	s.mu.Unlock()
	if !ok {
		return spec.ExecResult{}, errors.New("sandbox-not-found")
	}
	var r spec.ExecResult
	switch argv[0] {
	case "echo":
		r.Stdout = []byte(strings.Join(argv[1:], " ") + "\n")
	case "true":
	case "false":
		r.ExitCode = 1
	case "hostname":
		r.Stdout = []byte(id + "\n")
	case "env":
		r.Stdout = []byte(strings.Join(env, "\n") + "\n")
	case "sleep":
		<-ctx.Done()
		r.TimedOut, r.ExitCode = true, 137
	default:
		r.Stderr = []byte("sim: " + argv[0] + ": not found\n")
		r.ExitCode = 127
	}
	return r, nil
}

// Remove forgets the sandbox and removes its layer.
func (s *Sim) Remove(_ context.Context, id string) error {
	if d := s.layer(id); d != "" {
		if err := os.RemoveAll(d); err != nil {
			return fmt.Errorf("sim: remove layer: %w", err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.sbx, id)
	return nil
}

// Running reports whether the sandbox exists.
func (s *Sim) Running(_ context.Context, id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.sbx[id]
	return ok
}

// Count returns how many sandboxes exist.
func (s *Sim) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sbx)
}
