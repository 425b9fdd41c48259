// Package helperd assembles the root helper (bcd helper) from root's own
// configuration file: the socket server (internal/hosthelper), the typed
// host operations (hostops), the sandbox operations (sandboxops) on a
// sandbox host in the helper's own state directory, and the desired-state
// checker (desiredstate) that every host-changing operation passes first.
// Everything it trusts comes from helperconfig.Config, which only root
// writes; nothing the node sends moves a pin, a path or a runtime.
package helperd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/daemon/sandbox"
	"github.com/bettercompute/bettercompute/internal/daemon/sshaccess"
	"github.com/bettercompute/bettercompute/internal/desiredstate"
	"github.com/bettercompute/bettercompute/internal/hosthelper"
	"github.com/bettercompute/bettercompute/internal/hosthelper/helperconfig"
	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
	"github.com/bettercompute/bettercompute/internal/hosthelper/hostops"
	"github.com/bettercompute/bettercompute/internal/hosthelper/sandboxops"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/pki"
)

// Options are what the helper is built from besides root's file.
type Options struct {
	Config  helperconfig.Config
	NodeUID uint32
	NodeGID uint32
	Log     *slog.Logger
	Clock   clock.Clock
}

// Helper is an assembled root helper.
type Helper struct {
	Server  *hosthelper.Server
	Checker *desiredstate.Checker
	// Sandboxes is the helper's sandbox host (nil with sandbox_runtime
	// none).
	Sandboxes *sandbox.Host
	closers   []func()
	opts      Options
}

// Open builds the helper: its state directory (0700 root), the checker,
// the server with every operation registered, and the sandbox host when
// root configured a runtime.
func Open(ctx context.Context, o Options) (*Helper, error) {
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	c := o.Config
	if err := os.MkdirAll(c.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("helperd: state directory: %w", err)
	}
	if err := os.Chmod(c.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("helperd: state directory: %w", err)
	}
	chk, err := desiredstate.New(desiredstate.Config{PinnedRootSHA256: c.CommandRoots(), JoinKeyPin: c.JoinKey(),
		StateDir: filepath.Join(c.StateDir, "intent"), Clock: o.Clock, WorkerChains: pki.NewWorkerChainCache(0),
		NodeID: func() string { return c.NodeID }})
	if err != nil {
		return nil, err
	}
	h := &Helper{Checker: chk, opts: o}
	srv, err := hosthelper.New(hosthelper.Config{NodeUID: o.NodeUID, NodeGID: o.NodeGID, ExeSHA256: c.Executables(), Log: o.Log, Clock: o.Clock,
		Intent: func(req *helperwire.Request) error { _, err := chk.Check(req.Intent, req.Bundle); return err }})
	if err != nil {
		return nil, err
	}
	h.Server = srv
	if err := h.openSandboxes(ctx); err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

// Close releases the sandbox host's image store.
func (h *Helper) Close() {
	for _, f := range h.closers {
		f()
	}
	h.closers = nil
}

// Run runs the sandbox host's deadlines and sweep until ctx ends (a no-op
// without sandboxes).
func (h *Helper) Run(ctx context.Context) {
	if h.Sandboxes != nil {
		h.Sandboxes.Run(ctx, time.Second)
	}
}

// hostFiles writes the sshd files by kind and id through hostops (its
// table and its checks of every directory on the way), for sshaccess.
type hostFiles struct{ ops *hostops.Ops }

func (f hostFiles) WriteFile(_ context.Context, kind, id string, data []byte) error {
	return f.ops.WriteFile(kind, id, data)
}

func (f hostFiles) RemoveFile(_ context.Context, kind, id string) error {
	return f.ops.RemoveFile(kind, id)
}

// sshAccess is the ssh.access runner: the verified signed state applied
// by an sshaccess driver of the helper's own (its state in
// StateDir/sshaccess, its files written by kind and id in sshd_dir). The
// firewall, GPU reset and reboot operations of hostops are not served:
// no node operation needs them yet, and a destructive one would need the
// batch quorum checked here too.
func (h *Helper) sshAccess() (sandboxops.Runner, error) {
	c := h.opts.Config
	ops := &hostops.Ops{Files: hostops.DefaultFiles(c.SSHDDir, hostops.DefaultSSHDDropinDir)}
	delete(ops.Files, hostops.KindSSHDDropin) // sshd configuration is root's alone
	if err := ops.ValidateFiles(); err != nil {
		return sandboxops.Runner{}, fmt.Errorf("helperd: %w", err)
	}
	state := filepath.Join(c.StateDir, "sshaccess")
	if err := os.MkdirAll(state, 0o700); err != nil {
		return sandboxops.Runner{}, fmt.Errorf("helperd: %w", err)
	}
	d := &sshaccess.Driver{Dir: c.SSHDDir, StateDir: state, Files: hostFiles{ops}}
	return sandboxops.Runner{Kind: kinds.SSHAccess, Do: func(ctx context.Context, payload []byte) ([]byte, error) {
		d.SetNodeID(h.Checker.NodeID())
		return d.Run(ctx, kinds.SSHAccess, payload)
	}}, nil
}

// openSandboxes opens the helper's sandbox host when root configured a
// runtime (in StateDir/sandbox, on root's image store and runtime) and
// registers the signed-command operations: the sandbox ones and
// ssh.access, each checked under the desired-state checker's roots and
// the signed host section.
func (h *Helper) openSandboxes(ctx context.Context) error {
	c := h.opts.Config
	ssh, err := h.sshAccess()
	if err != nil {
		return err
	}
	cfg := sandboxops.Config{Trust: h.trust, StateDir: filepath.Join(c.StateDir, "sandboxops"), Clock: h.opts.Clock, Log: h.opts.Log,
		Extra: map[string]sandboxops.Runner{helperwire.OpSSHAccess: ssh}}
	if c.SandboxRuntime != "none" {
		host, closeImages, err := sandbox.Open(ctx, sandbox.Options{DataDir: c.StateDir, Runtime: c.SandboxRuntime, ImageStore: c.ImageStore,
			Slots: c.SandboxSlots, MemoryMB: c.SandboxMemoryMB, Egress: c.SandboxEgress, Clock: h.opts.Clock, Log: h.opts.Log})
		switch {
		case errors.Is(err, sandbox.ErrNoRuntime):
			h.opts.Log.Warn("no sandbox runtime usable: the helper runs no sandbox")
		case err != nil:
			return fmt.Errorf("helperd: sandbox host: %w", err)
		default:
			h.closers = append(h.closers, closeImages)
			h.Sandboxes, cfg.Host = host, host
		}
	}
	ops, err := sandboxops.New(cfg)
	if err != nil {
		return err
	}
	for op, hd := range ops.Handlers() {
		hd := hd
		h.Server.Handle(op, func(ctx context.Context, _ hosthelper.Caller, req *helperwire.Request) (json.RawMessage, error) {
			return hd(ctx, req)
		}, ops.ChangesHost(op))
	}
	return nil
}

// trust is what a sandbox command is checked under: the roots the checker
// holds and the host section of the desired state it verified (again:
// an equal generation passes), never the node's word.
func (h *Helper) trust(_ context.Context, req *helperwire.Request) (sandboxops.Trust, error) {
	ds, err := h.Checker.Check(req.Intent, req.Bundle)
	if err != nil {
		return sandboxops.Trust{}, err
	}
	return sandboxops.Trust{NodeID: ds.GetNodeId(), TrustDomain: ds.GetTrustDomain(), Roots: h.Checker.Roots(),
		Role: ds.GetHost().GetRole(), AllowedKinds: ds.GetHost().GetAllowedKinds()}, nil
}
