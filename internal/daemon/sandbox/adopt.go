package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// Lister is a runtime that lists the sandboxes it holds, so that a host
// that opens again (bcd restarted) kills every one it has no state for:
// nothing keeps running that the host cannot match to the spec it was
// given.
type Lister interface {
	// Instances lists the ids of the sandboxes the runtime holds,
	// running or not, and of the bundles it keeps for them.
	Instances(ctx context.Context) ([]string, error)
}

// Reasons a host reports, once its daemon listens (OnFailed), for the
// sandboxes it removed when it opened.
const (
	// ReasonLostAtRestart: the host has the sandbox's state, but its
	// runtime no longer runs it (a reboot, a killed runtime).
	ReasonLostAtRestart = "lost-at-restart"
	// ReasonUnknownToHost: the runtime runs a sandbox the host has no
	// readable state for; it was killed.
	ReasonUnknownToHost = "unknown-to-host"
)

// failure is a sandbox removed and not yet reported.
type failure struct{ id, reason string }

// killUnknown removes, from each of the host's runtimes, every sandbox
// it holds that the host has no state for, and queues its report. A
// runtime that cannot list is logged: the host still opens, with its
// known sandboxes.
func (h *Host) killUnknown(ctx context.Context) {
	for _, n := range h.names {
		if ls, ok := h.rts[n].(Lister); ok {
			h.killUnknownOn(ctx, n, ls)
		}
	}
}

// killUnknownOn is killUnknown on the runtime called name. An instance
// whose id the host holds on another runtime is left alone and logged:
// both would share the sandbox's cgroup, and removing it could kill the
// sandbox the host knows.
func (h *Host) killUnknownOn(ctx context.Context, name string, ls Lister) {
	ids, err := ls.Instances(ctx)
	if err != nil {
		h.cfg.Log.Error("sandbox runtime not listed; unknown sandboxes not killed", "runtime", name, "err", err)
		return
	}
	for _, id := range ids {
		if st, known := h.sbx[id]; known {
			if st.Runtime != name {
				h.cfg.Log.Warn("sandbox instance on another runtime than its state's left alone", "sandbox_id", id, "runtime", name)
			}
			continue
		}
		if spec.ValidSandboxID(id) != nil {
			h.cfg.Log.Warn("runtime instance with a foreign id left alone", "runtime", name, "id", fmt.Sprintf("%.64q", id))
			continue
		}
		h.cfg.Log.Warn("sandbox unknown to the host killed", "sandbox_id", id, "runtime", name)
		if err := h.rts[name].Remove(ctx, id); err != nil {
			h.cfg.Log.Error("unknown sandbox not removed", "sandbox_id", id, "err", err)
			continue
		}
		_ = os.Remove(h.statePath(id))
		h.atOpen = append(h.atOpen, failure{id, ReasonUnknownToHost})
	}
}

// takeAtOpen returns the removals of open not yet reported, marking each
// failed (an exec answers sandbox-failed until it is deleted); the host's
// lock is held.
func (h *Host) takeAtOpen() []failure {
	fs := h.atOpen
	h.atOpen = nil
	for _, f := range fs {
		h.failed[f.id] = true
	}
	return fs
}

// maxListOutput bounds what a runtime's list may print.
const maxListOutput = 4 << 20

// Instances lists the sandboxes the runtime's state root holds and the
// bundles the host keeps (either can outlive bcd).
func (o *OCI) Instances(ctx context.Context) ([]string, error) {
	var out capped
	out.max = maxListOutput
	cmd := exec.CommandContext(ctx, o.binary, o.argv(nil, "list", "--quiet")...)
	cmd.Stdout = &out
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s list: %w: %.512s", o.name, err, stderr.String())
	}
	if out.truncated {
		return nil, fmt.Errorf("%s list: more than %d bytes", o.name, maxListOutput)
	}
	seen := map[string]bool{}
	var ids []string
	add := func(id string) {
		if id != "" && !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	for _, l := range strings.Split(out.buf.String(), "\n") {
		add(strings.TrimSpace(l))
	}
	ents, err := os.ReadDir(o.bundles)
	if err != nil {
		return nil, fmt.Errorf("sandbox: list bundles: %w", err)
	}
	for _, e := range ents {
		if e.IsDir() {
			add(e.Name())
		}
	}
	return ids, nil
}
