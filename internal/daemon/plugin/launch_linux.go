package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"syscall"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
)

// DefaultHandshakeTimeout bounds how long a plugin may take to write its
// handshake, so a plugin that never answers does not hold up bcd's start.
const DefaultHandshakeTimeout = 10 * time.Second

// Spec is one pinned plugin: its name, the binary's path and SHA-256
// (hex), and the arguments and extra environment (KEY=VALUE) it runs with.
type Spec struct {
	Name   string
	Path   string
	SHA256 string
	Args   []string
	Env    []string
}

// Launcher starts plugins confined. The zero value is not usable: set Exe
// (bcd's own binary, os.Executable()) and, when bcd runs as root, Root with
// IDs from AssignIDs or User.
type Launcher struct {
	// Exe is the bcd binary whose ShimCommand becomes the plugin.
	Exe string
	// Root says bcd runs as root, so each plugin must get another identity:
	// User's when set, else its own id from IDs.
	Root bool
	User string
	IDs  map[string]uint32
	// Cgroup, when set, puts each plugin in its own cgroups with limits.
	Cgroup *CgroupConfig
	// HandshakeTimeout defaults to DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	Clock            clock.Clock
	// Stderr receives the plugin's standard error (default: discarded).
	Stderr io.Writer
	Log    *slog.Logger

	// fork is the thread plugins are started from (see forkThread).
	fork forkThread
}

// credential is the identity the plugin runs as: nil (bcd's own) when bcd
// is not root, else User's or the plugin's own id, never root, with no
// supplementary groups.
func (l *Launcher) credential(name string) (*syscall.Credential, error) {
	if !l.Root {
		return nil, nil
	}
	if l.User != "" {
		if l.User == "root" { // archtest:not-tenant (the account)
			return nil, refuse(CodeUserRoot, nil)
		}
		u, err := user.Lookup(l.User)
		if err != nil {
			return nil, refuse(CodeStart, fmt.Errorf("plugin user: %w", err))
		}
		uid, uerr := strconv.ParseUint(u.Uid, 10, 32)
		gid, gerr := strconv.ParseUint(u.Gid, 10, 32)
		if uerr != nil || gerr != nil || uid == 0 || gid == 0 {
			return nil, refuse(CodeUserRoot, nil)
		}
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
	}
	id, ok := l.IDs[name]
	if !ok || id < IDBase || id-IDBase >= IDSize {
		return nil, refuse(CodeStart, errors.New("no id assigned to the plugin"))
	}
	return &syscall.Credential{Uid: id, Gid: id, Groups: []uint32{}}, nil
}

// Start starts the plugin spec confined and waits for its handshake
// (bounded by HandshakeTimeout and ctx). The binary is opened and hashed
// (OpenPinned) before anything runs; a refusal carries its code. The
// returned Plugin must be closed.
func (l *Launcher) Start(ctx context.Context, spec Spec) (*Plugin, error) {
	if !ValidName(spec.Name) {
		return nil, refuse(CodeNameInvalid, nil)
	}
	cred, err := l.credential(spec.Name)
	if err != nil {
		return nil, err
	}
	bin, err := OpenPinned(spec.Path, spec.SHA256)
	if err != nil {
		return nil, err
	}
	defer bin.Close()
	p := &Plugin{name: spec.Name, log: l.logger().With("plugin", spec.Name), pending: map[uint64]chan Response{}, done: make(chan struct{})}
	if l.Cgroup != nil {
		if p.cg, err = NewCgroups(*l.Cgroup, spec.Name); err != nil {
			return nil, err
		}
	}
	if err := l.spawn(p, spec, bin, cred); err != nil {
		p.Close()
		return nil, err
	}
	if err := l.handshake(ctx, p); err != nil {
		p.Close()
		return nil, err
	}
	p.log.Info("plugin started", "pid", p.cmd.Process.Pid)
	return p, nil
}

func (l *Launcher) logger() *slog.Logger {
	if l.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l.Log
}

// spawn starts the shim in its own process group with the binary on fd 3
// and the gate on fd 4, adds it to the cgroups, then opens the gate.
func (l *Launcher) spawn(p *Plugin, spec Spec, bin *os.File, cred *syscall.Credential) error {
	gateR, gateW, err := os.Pipe()
	if err != nil {
		return refuse(CodeStart, fmt.Errorf("gate: %w", err))
	}
	defer gateW.Close()
	inR, inW, err := os.Pipe()
	if err != nil {
		gateR.Close()
		return refuse(CodeStart, fmt.Errorf("stdin: %w", err))
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		gateR.Close()
		inR.Close()
		inW.Close()
		return refuse(CodeStart, fmt.Errorf("stdout: %w", err))
	}
	stderr := l.Stderr
	if stderr == nil {
		stderr = io.Discard
	}
	cmd := &exec.Cmd{
		Path:       l.Exe,
		Args:       append([]string{l.Exe, ShimCommand, spec.Name}, spec.Args...),
		Env:        append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "BCX_PLUGIN_NAME=" + spec.Name}, spec.Env...),
		Dir:        "/",
		Stdin:      inR,
		Stdout:     outW,
		Stderr:     stderr,
		ExtraFiles: []*os.File{bin, gateR},
		SysProcAttr: &syscall.SysProcAttr{
			Setpgid:    true,
			Pdeathsig:  syscall.SIGKILL,
			Credential: cred,
		},
	}
	release, err := l.fork.start(cmd.Start)
	inR.Close()
	outW.Close()
	gateR.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		return refuse(CodeStart, fmt.Errorf("start shim: %w", err))
	}
	p.cmd, p.stdin, p.stdout, p.release = cmd, inW, outR, release
	if p.cg != nil {
		if err := p.cg.Add(cmd.Process.Pid); err != nil {
			return err
		}
	}
	if _, err := gateW.Write([]byte{1}); err != nil {
		return refuse(CodeStart, fmt.Errorf("open gate: %w", err))
	}
	return nil
}

// handshake reads the plugin's first line, bounded by MaxHandshake and
// the handshake timeout, then starts the reader of responses.
func (l *Launcher) handshake(ctx context.Context, p *Plugin) error {
	d := l.HandshakeTimeout
	if d <= 0 {
		d = DefaultHandshakeTimeout
	}
	clk := l.Clock
	if clk == nil {
		clk = clock.Real{}
	}
	timer := clk.NewTimer(d)
	defer timer.Stop()
	type result struct {
		name string
		err  error
	}
	lr := NewLineReader(p.stdout)
	got := make(chan result, 1)
	go func() {
		line, err := lr.ReadLine(MaxHandshake, CodeHandshakeTooLarge)
		if err != nil {
			got <- result{err: handshakeReadError(err)}
			return
		}
		name, inv, err := DecodeHandshake(line)
		p.inv = inv
		got <- result{name: name, err: err}
	}()
	select {
	case r := <-got:
		if r.err == nil && r.name != p.name {
			r.err = refuse(CodeHandshakeInvalid, errors.New("handshake names another plugin"))
		}
		if r.err != nil {
			return r.err
		}
	case <-timer.C():
		return refuse(CodeHandshakeTimeout, nil)
	case <-ctx.Done():
		return refuse(CodeHandshakeTimeout, ctx.Err())
	}
	p.mu.Lock()
	p.reading = true
	p.mu.Unlock()
	go p.readLoop(lr)
	return nil
}

func handshakeReadError(err error) error {
	if CodeOf(err) != "" {
		return err
	}
	return refuse(CodeExited, fmt.Errorf("before the handshake: %w", err))
}
