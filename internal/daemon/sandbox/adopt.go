package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"sort"
	"strings"

	"github.com/bettercompute/bettercompute/internal/kinds"

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
	// ReasonSpecUnmatched: the runtime runs a sandbox whose state the
	// host cannot match to the signed commands it was written from (none
	// kept, one that no longer verifies, or a field that differs); it was
	// killed at adoption (Adopt).
	ReasonSpecUnmatched = "spec-unmatched"
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

// SpecCheck verifies a signed command the host kept (a marshalled
// nodev1.SignedCommand) again, as the daemon did when it arrived except
// for freshness and replay: signed by a worker key chained to the node's
// pinned command roots, for this node, of kind. It returns the command's
// payload, or why it does not verify.
type SpecCheck func(signed []byte, kind string) (payload []byte, err error)

// Adopt checks each sandbox the host found running when it opened
// against the signed commands its state keeps, verified again with
// check: the signed create, and the signed claim and last update when it
// had them, must give exactly the state's spec (runtime, image, limits,
// user, network, checkpoints, environment, deadline, warm). A sandbox
// that does not match (its commands missing, not verifying, or naming
// something else) is killed and removed and reported ReasonSpecUnmatched
// (through OnFailed). It returns the ids it adopted, sorted; a later call
// checks nothing and returns none.
func (h *Host) Adopt(ctx context.Context, check SpecCheck) []string {
	h.mu.Lock()
	loaded := h.loaded
	h.loaded = nil
	h.mu.Unlock()
	var kept []string
	for _, id := range loaded {
		st, ok := h.Get(id)
		if !ok {
			continue // lost or removed since open
		}
		err := matchSigned(&st, check)
		if err == nil {
			kept = append(kept, id)
			continue
		}
		h.cfg.Log.Warn("sandbox not matched to its signed spec killed", "sandbox_id", id, "err", err)
		if err := h.remove(ctx, id); err != nil {
			h.cfg.Log.Error("unmatched sandbox not removed", "sandbox_id", id, "err", err)
			continue
		}
		h.reportFailed(id, ReasonSpecUnmatched)
	}
	sort.Strings(kept)
	return kept
}

// reportFailed marks sandbox id failed and tells the OnFailed function,
// or queues the report until one is set.
func (h *Host) reportFailed(id, reason string) {
	h.mu.Lock()
	h.failed[id] = true
	f := h.onFailed
	if f == nil {
		h.atOpen = append(h.atOpen, failure{id, reason})
	}
	h.mu.Unlock()
	if f != nil {
		f(id, reason)
	}
}

// signedSpec is what the signed commands of a sandbox say its state is.
type signedSpec struct {
	ID, Runtime, ImageDigest, Network, FromCheckpoint, FromMemory string
	Limits                                                        spec.Limits
	Root, Warm                                                    bool
	Env                                                           map[string]string
	DeadlineMS                                                    int64
}

// specOf is the signedSpec st holds.
func specOf(st *State) signedSpec {
	return signedSpec{ID: st.ID, Runtime: st.Runtime, ImageDigest: st.ImageDigest, Network: st.Network,
		FromCheckpoint: st.FromCheckpoint, FromMemory: st.FromMemory, Limits: st.Limits, Root: st.Root,
		Warm: st.Warm, Env: nonEmpty(st.Env), DeadlineMS: st.DeadlineMS}
}

func nonEmpty(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	return m
}

// matchSigned verifies st's signed commands with check and compares what
// they say with st; it returns why they do not match, or nil.
func matchSigned(st *State, check SpecCheck) error {
	if len(st.SignedCreate) == 0 {
		return errors.New("no signed create kept")
	}
	raw, err := check(st.SignedCreate, kinds.SandboxCreate)
	if err != nil {
		return fmt.Errorf("signed create: %w", err)
	}
	var c spec.Create
	if err := strictJSON(raw, &c); err != nil || c.Validate() != nil {
		return errors.New("signed create payload invalid")
	}
	want := signedSpec{ID: c.SandboxID, Runtime: c.Runtime, ImageDigest: c.ImageDigest, Network: c.Network,
		FromCheckpoint: c.FromCheckpoint, FromMemory: c.FromMemory, Limits: c.Limits, Root: c.Root,
		Warm: c.Warm, Env: nonEmpty(c.Env), DeadlineMS: c.DeadlineMS}
	if len(st.SignedClaim) > 0 {
		u, err := signedUpdate(st.SignedClaim, check, st.ID)
		if err != nil || !u.Claim || !c.Warm {
			return errors.New("signed claim does not verify or claims no warm sandbox")
		}
		want.Warm, want.Env, want.DeadlineMS = false, nonEmpty(u.Env), u.DeadlineMS
	}
	if len(st.SignedUpdate) > 0 {
		u, err := signedUpdate(st.SignedUpdate, check, st.ID)
		if err != nil || (u.Claim && len(st.SignedClaim) == 0) {
			return errors.New("signed update does not verify")
		}
		want.DeadlineMS = u.DeadlineMS
	}
	if !reflect.DeepEqual(want, specOf(st)) {
		return errors.New("state differs from its signed spec")
	}
	return nil
}

// signedUpdate verifies a kept sandbox.update for sandbox id.
func signedUpdate(signed []byte, check SpecCheck, id string) (spec.Update, error) {
	raw, err := check(signed, kinds.SandboxUpdate)
	if err != nil {
		return spec.Update{}, err
	}
	var u spec.Update
	if err := strictJSON(raw, &u); err != nil || u.Validate() != nil || u.SandboxID != id {
		return spec.Update{}, errors.New("signed update payload invalid or for another sandbox")
	}
	return u, nil
}
