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
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/daemon/sandbox"
	"github.com/bettercompute/bettercompute/internal/desiredstate"
	"github.com/bettercompute/bettercompute/internal/hosthelper"
	"github.com/bettercompute/bettercompute/internal/hosthelper/helperconfig"
	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
	"github.com/bettercompute/bettercompute/internal/hosthelper/hostops"
	"github.com/bettercompute/bettercompute/internal/hosthelper/sandboxops"
	"github.com/bettercompute/bettercompute/internal/pki"
)

// Options are what the helper is built from besides root's file.
type Options struct {
	Config  helperconfig.Config
	NodeUID uint32
	NodeGID uint32
	Log     *slog.Logger
	Clock   clock.Clock
	// Hostname names the sim driver's machine (inventory).
	Hostname string
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
	if err := h.registerHostOps(); err != nil {
		return nil, err
	}
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

// registerHostOps registers file.write, file.remove, firewall.apply,
// gpu.reset and host.reboot: each host-changing, each decoding its
// arguments strictly.
func (h *Helper) registerHostOps() error {
	c := h.opts.Config
	drv, err := driver.New(c.Driver, h.opts.Hostname)
	if err != nil {
		return fmt.Errorf("helperd: %w", err)
	}
	ops := &hostops.Ops{Files: hostops.DefaultFiles(c.SSHDDir, hostops.DefaultSSHDDropinDir), GPU: hostops.SysfsResetter{}, Rebooter: hostops.SystemctlRebooter{}}
	if err := ops.ValidateFiles(); err != nil {
		return fmt.Errorf("helperd: %w", err)
	}
	srv := h.Server
	srv.Handle(helperwire.OpFileWrite, argsHandler(func(ctx context.Context, a helperwire.FileWrite) error { return ops.WriteFile(a.Kind, a.ID, a.Data) }), true)
	srv.Handle(helperwire.OpFileRemove, argsHandler(func(ctx context.Context, a helperwire.FileRef) error { return ops.RemoveFile(a.Kind, a.ID) }), true)
	srv.Handle(helperwire.OpFirewallApply, argsHandler(func(ctx context.Context, a helperwire.FirewallApply) error { return ops.ApplyRuleset(ctx, a.Ruleset) }), true)
	srv.Handle(helperwire.OpGPUReset, argsHandler(func(ctx context.Context, a helperwire.GPUReset) error {
		return ops.ResetGPU(ctx, a.GPU, drv.Inventory())
	}), true)
	srv.Handle(helperwire.OpReboot, argsHandler(func(ctx context.Context, a helperwire.Reboot) error { return ops.Reboot(ctx, a.Reason) }), true)
	return nil
}

// argsHandler adapts an operation on decoded arguments to a server
// handler: the arguments decode strictly (args-invalid otherwise) and a
// done operation answers {"done":true}.
func argsHandler[A any](do func(context.Context, A) error) hosthelper.Handler {
	return func(ctx context.Context, _ hosthelper.Caller, req *helperwire.Request) (json.RawMessage, error) {
		var a A
		if ref := hosthelper.DecodeArgs(req.Args, &a); ref != nil {
			return nil, ref
		}
		if err := do(ctx, a); err != nil {
			return nil, err
		}
		return json.RawMessage(`{"done":true}`), nil
	}
}

// openSandboxes opens the helper's sandbox host (in StateDir/sandbox, on
// root's image store and runtime) and registers the sandbox operations,
// whose commands are checked under the desired-state checker's roots and
// the signed host section.
func (h *Helper) openSandboxes(ctx context.Context) error {
	c := h.opts.Config
	if c.SandboxRuntime == "none" {
		return nil
	}
	host, closeImages, err := sandbox.Open(ctx, sandbox.Options{DataDir: c.StateDir, Runtime: c.SandboxRuntime, ImageStore: c.ImageStore,
		Slots: c.SandboxSlots, MemoryMB: c.SandboxMemoryMB, Egress: c.SandboxEgress, Clock: h.opts.Clock, Log: h.opts.Log})
	if errors.Is(err, sandbox.ErrNoRuntime) {
		h.opts.Log.Warn("no sandbox runtime usable: the helper runs no sandbox")
		return nil
	}
	if err != nil {
		return fmt.Errorf("helperd: sandbox host: %w", err)
	}
	h.closers = append(h.closers, closeImages)
	h.Sandboxes = host
	ops, err := sandboxops.New(sandboxops.Config{Host: host, Trust: h.trust, StateDir: filepath.Join(c.StateDir, "sandboxops"), Clock: h.opts.Clock, Log: h.opts.Log})
	if err != nil {
		return err
	}
	for op, hd := range ops.Handlers() {
		hd := hd
		h.Server.Handle(op, func(ctx context.Context, _ hosthelper.Caller, req *helperwire.Request) (json.RawMessage, error) {
			return hd(ctx, req)
		}, sandboxops.ChangesHost(op))
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
