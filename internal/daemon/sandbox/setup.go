package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/sandboxes/checkpoint"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// Options open a node's sandbox host.
type Options struct {
	DataDir string // the node's data directory; the host lives in DataDir/sandbox
	// Runtime is runc, runsc, sim, auto (runc when usable, else runsc
	// when it works here, else none), or a comma-separated list of
	// runc and runsc ("runc,runsc"): the host then runs each, and every
	// one must be usable or Open fails naming it.
	Runtime    string
	ImageStore string // gocloud.dev/blob URL of the image store
	Slots      int
	MemoryMB   int64
	Clock      clock.Clock
	Log        *slog.Logger
	// Egress is auto (wire network egress when iproute2 and nftables
	// work; runc and runsc only) or off.
	Egress string
	// EgressRange and EgressPort configure the links and the proxy (see
	// EgressConfig); zero values take the defaults.
	EgressRange string
	EgressPort  int
	// IDBase and IDSize place the host id range of runc sandboxes' user
	// namespaces (see HostConfig); zero values take the defaults.
	IDBase, IDSize uint32
}

// ErrNoRuntime is returned by Open for auto when no runtime is usable or
// no image store is configured: the node is then no sandbox host.
var ErrNoRuntime = errors.New("sandbox: no usable runtime (runc needs to be installed and bcd to run as root)")

// Usable reports whether the OCI runtime called name can run here: its
// binary is on PATH and the process is root.
func Usable(name string) (string, bool) {
	p, err := exec.LookPath(name)
	return p, err == nil && os.Geteuid() == 0
}

// Open opens the sandbox host of a node; the returned close releases the
// image store.
func Open(ctx context.Context, o Options) (*Host, func(), error) {
	if o.Runtime == "auto" && o.ImageStore == "" {
		return nil, nil, ErrNoRuntime
	}
	names, err := runtimeNames(ctx, o)
	if err != nil {
		return nil, nil, err
	}
	if o.ImageStore == "" {
		return nil, nil, errors.New("sandbox: an image store URL is required")
	}
	dir := filepath.Join(o.DataDir, "sandbox")
	var rts []Runtime
	for _, name := range names {
		rt, err := newRuntime(ctx, name, RuntimeDir(dir, name, names), dir, o.Runtime != "auto")
		if err != nil {
			return nil, nil, err
		}
		rts = append(rts, rt)
	}
	eg, err := openEgress(ctx, o, slices.Contains(names, spec.RuntimeRunc))
	if err != nil {
		return nil, nil, err
	}
	closeEgress := func() {
		if eg != nil {
			eg.Close()
		}
	}
	im, err := OpenImages(ctx, o.ImageStore, filepath.Join(dir, "images"))
	if err != nil {
		closeEgress()
		return nil, nil, err
	}
	// Checkpoints live on the images' object store.
	cs, err := checkpoint.OpenStore(ctx, o.ImageStore)
	if err != nil {
		im.Close()
		closeEgress()
		return nil, nil, err
	}
	h, err := OpenHost(ctx, HostConfig{Dir: dir, Runtimes: rts, Images: im, Clock: o.Clock, Log: o.Log, Slots: o.Slots, MemoryMB: o.MemoryMB, Egress: eg, IDBase: o.IDBase, IDSize: o.IDSize, Checkpoints: cs})
	if err != nil {
		cs.Close()
		im.Close()
		closeEgress()
		return nil, nil, err
	}
	return h, func() {
		_ = cs.Close()
		_ = im.Close()
		closeEgress()
	}, nil
}

// runtimeNames resolves o.Runtime to the names of the host's runtimes:
// auto to the first usable of runc and runsc (ErrNoRuntime when none),
// a list to its names, each once. sim runs alone.
func runtimeNames(ctx context.Context, o Options) ([]string, error) {
	if o.Runtime == "auto" {
		for _, rt := range []string{spec.RuntimeRunc, spec.RuntimeRunsc} {
			bin, ok := Usable(rt)
			if ok && rt == spec.RuntimeRunsc {
				if err := ProbeRunsc(ctx, bin, filepath.Join(o.DataDir, "sandbox")); err != nil {
					if o.Log != nil {
						o.Log.Warn("runsc does not work here", "err", err)
					}
					ok = false
				}
			}
			if ok {
				return []string{rt}, nil
			}
		}
		return nil, ErrNoRuntime
	}
	var names []string
	for _, n := range strings.Split(o.Runtime, ",") {
		n = strings.TrimSpace(n)
		switch {
		case n != spec.RuntimeRunc && n != spec.RuntimeRunsc && n != spec.RuntimeSim:
			return nil, errors.New("sandbox: runtime must be runc, runsc, sim, auto, or a comma-separated list of runc and runsc")
		case slices.Contains(names, n):
			return nil, fmt.Errorf("sandbox: runtime %s listed twice", n)
		}
		names = append(names, n)
	}
	if len(names) > 1 && slices.Contains(names, spec.RuntimeSim) {
		return nil, errors.New("sandbox: the sim runtime runs alone, not with runc or runsc")
	}
	return names, nil
}

// RuntimeDir is the directory of the OCI runtime called name on the host
// in dir running names: dir/rt for runc, and for runsc when it is the
// host's only OCI runtime (the layout of a host with one runtime), else
// dir/rt-runsc. Two runtimes on one host thus never share a state root
// or bundles (runc's bundles folder is named after its directory).
func RuntimeDir(dir, name string, names []string) string {
	if name == spec.RuntimeRunc || !slices.Contains(names, spec.RuntimeRunc) {
		return filepath.Join(dir, "rt")
	}
	return filepath.Join(dir, "rt-"+name)
}

// newRuntime makes the runtime called name with its state in rtDir, on
// the host in dir; probe has runsc tried first (auto probed it already).
func newRuntime(ctx context.Context, name, rtDir, dir string, probe bool) (Runtime, error) {
	switch name {
	case spec.RuntimeSim:
		return NewSim(), nil
	case spec.RuntimeRunc, spec.RuntimeRunsc:
		bin, ok := Usable(name)
		if !ok {
			return nil, fmt.Errorf("sandbox: %s is not usable here (installed, and bcd running as root?)", name)
		}
		// runsc is advertised only when a gVisor sandbox really runs here.
		if name == spec.RuntimeRunsc && probe {
			if err := ProbeRunsc(ctx, bin, dir); err != nil {
				return nil, err
			}
		}
		return NewOCI(name, bin, rtDir)
	default:
		return nil, errors.New("sandbox: runtime must be runc, runsc, sim or auto")
	}
}

// openEgress wires network egress for runc (when the host runs it) when o
// asks for it (auto) and this machine can: a failure to set it up leaves the host
// without egress (it does not advertise it), logged, rather than without
// sandboxes.
func openEgress(ctx context.Context, o Options, runc bool) (*Egress, error) {
	switch o.Egress {
	case "off":
		return nil, nil
	case "", "auto":
	default:
		return nil, errors.New("sandbox: egress must be auto or off")
	}
	if !runc {
		return nil, nil // egress runs on runc only (see Host.egress)
	}
	cfg := EgressConfig{Port: o.EgressPort, Log: o.Log}
	if o.EgressRange != "" {
		p, err := netip.ParsePrefix(o.EgressRange)
		if err != nil {
			return nil, fmt.Errorf("sandbox: egress range: %w", err)
		}
		cfg.Range = p
	}
	eg, err := NewEgress(ctx, cfg)
	if err != nil {
		if o.Log != nil {
			o.Log.Warn("sandbox egress unavailable", "err", err)
		}
		return nil, nil
	}
	return eg, nil
}

// ProbeRunsc checks that gVisor works on this machine with the flags bcd
// uses (ptrace platform, no network): it runs echo in a throwaway runsc
// sandbox (`runsc do`, the host's root read-only under gVisor) and wants
// its output back within 30 s. runsc can be installed and still fail,
// e.g. where ptrace is forbidden or the kernel lacks what gVisor needs.
func ProbeRunsc(ctx context.Context, bin, dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("sandbox: runsc probe: %w", err)
	}
	tmp, err := os.MkdirTemp(dir, "runsc-probe-")
	if err != nil {
		return fmt.Errorf("sandbox: runsc probe: %w", err)
	}
	defer os.RemoveAll(tmp)
	out, err := os.Create(filepath.Join(tmp, "out"))
	if err != nil {
		return fmt.Errorf("sandbox: runsc probe: %w", err)
	}
	defer out.Close()
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	const token = "bc-runsc-probe-ok"
	cmd := exec.CommandContext(pctx, bin, "--root", filepath.Join(tmp, "state"), "--platform=ptrace", "--network=none", "do", "echo", token)
	cmd.Stdout, cmd.Stderr = out, out
	runErr := cmd.Run()
	b, _ := os.ReadFile(out.Name())
	if runErr != nil || !strings.Contains(string(b), token) {
		msg := strings.TrimSpace(string(b))
		if len(msg) > 512 {
			msg = msg[:512]
		}
		return fmt.Errorf("sandbox: runsc does not work here: %v: %s", runErr, msg)
	}
	return nil
}
