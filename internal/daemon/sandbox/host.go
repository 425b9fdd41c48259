// Package sandbox is bcd's sandbox host: it runs the sandbox.* command
// kinds on real OCI runtimes (runc, runsc, or both side by side, each
// sandbox on the one its spec names) or the sim runtime, from the exact
// spec the control plane signed. It fetches images by
// digest and verifies them before unpacking, builds one OCI bundle per
// sandbox (read-only image under a size-limited writable layer, no
// capabilities, no new privileges, a seccomp profile, masked kernel
// paths, cgroup limits, its own namespaces with only loopback, or for
// network egress one veth link whose only reachable service is the
// host's egress proxy), keeps each
// sandbox's signed deadline in its own 0600 state, and stops and removes
// every sandbox at its deadline, with or without a session to the control
// plane.
package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/sandboxes/checkpoint"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// State is what the host keeps of one sandbox (0600 JSON under its data
// directory): the signed spec's fields it enforces later.
type State struct {
	ID          string            `json:"id"`
	Runtime     string            `json:"runtime"`
	ImageDigest string            `json:"image_digest"`
	Limits      spec.Limits       `json:"limits"`
	Root        bool              `json:"root"`
	Env         map[string]string `json:"env,omitempty"`
	DeadlineMS  int64             `json:"deadline_ms"`
	Warm        bool              `json:"warm"`
	CreatedMS   int64             `json:"created_ms"`
	Network     string            `json:"network,omitempty"`
	Link        *Link             `json:"link,omitempty"` // egress only
	// IDs is the sandbox's block of host ids (runc only), held from
	// create to remove and never handed to another sandbox meanwhile.
	IDs IDRange `json:"ids,omitzero"`
	// FromCheckpoint and FromMemory are the checkpoints the sandbox was
	// restored from (digests; empty for a fresh one).
	FromCheckpoint string `json:"from_checkpoint,omitempty"`
	FromMemory     string `json:"from_memory,omitempty"`
	// SignedCreate, SignedClaim and SignedUpdate are the signed commands
	// (marshalled nodev1.SignedCommand, as the daemon verified them) the
	// state was written from: the create, the claiming update, and the
	// last update. At adoption the host verifies them again and keeps
	// the sandbox only when they match the state (see Host.Adopt).
	SignedCreate []byte `json:"signed_create,omitempty"`
	SignedClaim  []byte `json:"signed_claim,omitempty"`
	SignedUpdate []byte `json:"signed_update,omitempty"`
	// started is set once the runtime started the sandbox (in memory: a
	// sandbox loaded at open is running).
	started bool
}

// HostConfig configures a sandbox host.
type HostConfig struct {
	Dir string // state root (0700), e.g. DATA/sandbox
	// Runtime is the host's runtime when it runs one; Runtimes are its
	// runtimes when it runs several (Runtime, when also set, counts as
	// the first). Each name may appear once; a sandbox runs on the one
	// its signed spec names, and every later operation on it goes there.
	Runtime  Runtime
	Runtimes []Runtime
	Images   *Images
	Clock    clock.Clock
	Log      *slog.Logger
	// Slots bounds how many sandboxes run at once; MemoryMB bounds the sum
	// of their memory limits. Both are advertised to the control plane.
	Slots    int
	MemoryMB int64
	// Egress wires network egress; nil refuses it (network-unavailable).
	Egress *Egress
	// IDBase and IDSize place the host id range reserved for runc
	// sandboxes' user namespaces: Slots blocks of IDSize ids from
	// IDBase (defaults DefaultIDBase and DefaultIDSize). Nothing else on
	// the machine may use these ids.
	IDBase, IDSize uint32
	// Checkpoints is the checkpoint store (on the images' object store);
	// nil refuses sandbox.checkpoint and restores
	// (checkpoint-unavailable).
	Checkpoints *checkpoint.Store
}

// Host runs sandboxes on one machine.
type Host struct {
	cfg HostConfig
	// rts are the host's runtimes by name; names lists them in order.
	rts   map[string]Runtime
	names []string
	mu    sync.Mutex
	sbx   map[string]*State
	// failed holds the sandboxes whose runtime instance died and that
	// the host removed: an exec answers sandbox-failed until they are
	// deleted.
	failed map[string]bool
	// onFailed, when set, is told of each sandbox the sweep found dead
	// and removed (the daemon reports it to the control plane).
	onFailed func(sandboxID, reason string)
	// ckpt serialises checkpoints (see Checkpoint).
	ckpt sync.Mutex
	// atOpen holds the sandboxes removed when the host opened, until
	// OnFailed takes them to report.
	atOpen []failure
	// loaded are the sandboxes the host found running at open, not yet
	// checked against their signed commands (Adopt).
	loaded []string
	// secretVals holds, in memory only, the values of the secret
	// references each sandbox's env names (sandbox id → reference →
	// value), resolved through the broker for the create or claim that
	// carried them. State.Env keeps the references; nothing writes a
	// value to a file, the journal, a log or a result.
	secretVals map[string]map[string]string
}

// ReasonRuntimeDied is the reason a host gives for a sandbox whose
// runtime instance died (gVisor's kernel killed at a limit).
const ReasonRuntimeDied = "runtime-died"

// OnFailed sets f to be called, outside the host's lock, with each
// sandbox the sweep finds dead and removes, and at once with each the
// host removed when it opened (ReasonLostAtRestart, ReasonUnknownToHost).
// A later call replaces f.
func (h *Host) OnFailed(f func(sandboxID, reason string)) {
	h.mu.Lock()
	h.onFailed = f
	var tell []failure
	if f != nil {
		tell = h.takeAtOpen()
	}
	h.mu.Unlock()
	for _, x := range tell {
		f(x.id, x.reason)
	}
}

// OpenHost loads the host's sandboxes from cfg.Dir. A sandbox whose state
// survives but whose runtime instance does not (a reboot), or whose
// runtime the host no longer runs, is removed.
func OpenHost(ctx context.Context, cfg HostConfig) (*Host, error) {
	rts, names, err := hostRuntimes(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.Images == nil {
		return nil, errors.New("sandbox: a runtime and an image store are required")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Slots <= 0 {
		cfg.Slots = 16
	}
	if cfg.MemoryMB <= 0 {
		cfg.MemoryMB = 8 << 10
	}
	if cfg.IDBase == 0 {
		cfg.IDBase = DefaultIDBase
	}
	if cfg.IDSize == 0 {
		cfg.IDSize = DefaultIDSize
	}
	if err := checkIDRange(cfg.IDBase, cfg.IDSize, cfg.Slots); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(cfg.Dir, "state"), 0o700); err != nil {
		return nil, fmt.Errorf("sandbox: state dir: %w", err)
	}
	if s, ok := rts[spec.RuntimeSim].(*Sim); ok {
		s.useDir(filepath.Join(cfg.Dir, "sim"))
	}
	h := &Host{cfg: cfg, rts: rts, names: names, sbx: map[string]*State{}, failed: map[string]bool{}, secretVals: map[string]map[string]string{}}
	ents, err := os.ReadDir(filepath.Join(cfg.Dir, "state"))
	if err != nil {
		return nil, fmt.Errorf("sandbox: read state: %w", err)
	}
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if ok && spec.ValidSandboxID(id) == nil {
			h.load(ctx, id)
		}
	}
	h.killUnknown(ctx)
	h.Sweep(ctx)
	return h, nil
}

// hostRuntimes returns cfg's runtimes by name and their names in order,
// refusing none and a name given twice.
func hostRuntimes(cfg HostConfig) (map[string]Runtime, []string, error) {
	all := cfg.Runtimes
	if cfg.Runtime != nil {
		all = append([]Runtime{cfg.Runtime}, all...)
	}
	if len(all) == 0 {
		return nil, nil, errors.New("sandbox: a runtime and an image store are required")
	}
	rts := map[string]Runtime{}
	var names []string
	for _, rt := range all {
		if rt == nil {
			return nil, nil, errors.New("sandbox: a nil runtime")
		}
		if _, dup := rts[rt.Name()]; dup {
			return nil, nil, fmt.Errorf("sandbox: runtime %s given twice", rt.Name())
		}
		rts[rt.Name()] = rt
		names = append(names, rt.Name())
	}
	return rts, names, nil
}

// load reads sandbox id's state at open and keeps it when its runtime
// still runs it (restoring its egress proxy), else removes it and queues
// its report (ReasonLostAtRestart).
func (h *Host) load(ctx context.Context, id string) {
	var st State
	b, err := os.ReadFile(h.statePath(id))
	if err != nil || json.Unmarshal(b, &st) != nil || st.ID != id {
		h.cfg.Log.Warn("sandbox state unreadable", "sandbox_id", id)
		return
	}
	st.started = true
	h.sbx[id] = &st
	h.loaded = append(h.loaded, id)
	rt := h.rts[st.Runtime]
	if rt == nil {
		// Its runtime is not on this host any more: nothing here runs it.
		h.cfg.Log.Warn("sandbox runtime not on this host", "sandbox_id", id, "runtime", fmt.Sprintf("%.32q", st.Runtime))
	}
	if rt == nil || !rt.Running(ctx, id) {
		h.cfg.Log.Warn("sandbox lost by its runtime", "sandbox_id", id)
		_ = h.remove(ctx, id)
		h.atOpen = append(h.atOpen, failure{id, ReasonLostAtRestart})
		return
	}
	if st.Link != nil {
		if h.cfg.Egress == nil {
			h.cfg.Log.Warn("egress sandbox on a host without egress", "sandbox_id", id)
			_ = h.remove(ctx, id)
		} else if err := h.cfg.Egress.Listen(ctx, id, *st.Link); err != nil {
			h.cfg.Log.Error("sandbox egress proxy not restored", "sandbox_id", id, "err", err)
		}
	}
}

// runtimeOf returns the runtime sandbox id runs on, or nil when the host
// does not hold it (or no longer runs its runtime).
func (h *Host) runtimeOf(id string) Runtime {
	h.mu.Lock()
	defer h.mu.Unlock()
	st, ok := h.sbx[id]
	if !ok {
		return nil
	}
	return h.rts[st.Runtime]
}

// Runtime returns the host's runtime names, comma-separated, in order.
func (h *Host) Runtime() string { return strings.Join(h.names, ",") }

// Runtimes returns the host's runtime names in order.
func (h *Host) Runtimes() []string { return append([]string(nil), h.names...) }

// Labels are the capability labels bcd advertises in Hello; only bcd
// sets labels under spec.LabelPrefix.
func (h *Host) Labels() map[string]string {
	l := map[string]string{
		spec.LabelPrefix + "sandbox.slots":     strconv.Itoa(h.cfg.Slots),
		spec.LabelPrefix + "sandbox.memory_mb": strconv.FormatInt(h.cfg.MemoryMB, 10),
	}
	for _, n := range h.names {
		l[spec.RuntimeLabel(n)] = "true"
	}
	if h.egress() {
		l[spec.EgressLabel] = "true"
	}
	return l
}

// egress reports whether this host runs egress sandboxes: it has the
// egress wiring and runs runc (egress sandboxes run on runc only). gVisor refuses to join a network
// namespace it did not make ("cannot run with network enabled in root
// network namespace"), so runsc hosts run network none only.
func (h *Host) egress() bool {
	return h.cfg.Egress != nil && h.rts[spec.RuntimeRunc] != nil
}

func (h *Host) statePath(id string) string { return filepath.Join(h.cfg.Dir, "state", id+".json") }

func (h *Host) save(st *State) error {
	b, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("sandbox: encode state: %w", err)
	}
	if err := pki.WriteFileAtomic(h.statePath(st.ID), b, 0o600); err != nil {
		return fmt.Errorf("sandbox: write state: %w", err)
	}
	return nil
}

// Create runs sandbox.create: it checks the signed spec, reserves a slot,
// memory, an egress link and an id range, writes the state, then has the
// runtime start the sandbox.
func (h *Host) Create(ctx context.Context, payload []byte) ([]byte, error) {
	c, err := h.checkCreate(payload)
	if err != nil {
		return nil, err
	}
	now := h.cfg.Clock.Now()
	if c.DeadlineMS <= now.UnixMilli() {
		return nil, errors.New("deadline-passed")
	}
	vals, err := h.resolveEnv(ctx, c.SandboxID, c.Env, nil, nil)
	if err != nil {
		return nil, err
	}
	st, err := h.reserve(c, now)
	if err != nil {
		return nil, err
	}
	st.SignedCreate = driver.CommandFrom(ctx)
	h.keepSecrets(c.SandboxID, vals)
	// The state is written before anything starts, so the sweep removes
	// whatever a crash in the middle leaves behind.
	if err := h.save(st); err != nil {
		h.forget(c.SandboxID)
		return nil, err
	}
	if err := h.launch(ctx, c, st); err != nil {
		return nil, err
	}
	h.mu.Lock()
	st.started = true
	h.mu.Unlock()
	h.cfg.Log.Info("sandbox started", "sandbox_id", c.SandboxID, "runtime", c.Runtime, "deadline_ms", c.DeadlineMS, "warm", c.Warm)
	return json.Marshal(map[string]any{"sandbox_id": c.SandboxID, "runtime": c.Runtime, "deadline_ms": c.DeadlineMS})
}

// checkCreate decodes a sandbox.create payload and checks that its
// runtime is one of this host's and that the host offers its network on
// that runtime.
func (h *Host) checkCreate(payload []byte) (spec.Create, error) {
	var c spec.Create
	if err := strictJSON(payload, &c); err != nil || c.Validate() != nil {
		return spec.Create{}, errors.New("payload-invalid")
	}
	if h.rts[c.Runtime] == nil {
		return spec.Create{}, errors.New("runtime-unavailable")
	}
	if c.Network == spec.NetworkEgress && (!h.egress() || c.Runtime != spec.RuntimeRunc) {
		return spec.Create{}, errors.New("network-unavailable")
	}
	return c, nil
}

// reserve records sandbox c, made at now, under the host's lock when it
// is new and fits: a slot, its memory, an egress link when it asks for
// one, and (runc) a block of host ids. Every refusal is no-capacity
// except a duplicate's (sandbox-exists).
func (h *Host) reserve(c spec.Create, now time.Time) (*State, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, dup := h.sbx[c.SandboxID]; dup {
		return nil, errors.New("sandbox-exists")
	}
	var mem int64
	for _, s := range h.sbx {
		mem += s.Limits.MemoryMB
	}
	if len(h.sbx) >= h.cfg.Slots || mem+c.Limits.MemoryMB > h.cfg.MemoryMB {
		return nil, errors.New("no-capacity")
	}
	st := &State{ID: c.SandboxID, Runtime: c.Runtime, ImageDigest: c.ImageDigest, Limits: c.Limits, Root: c.Root,
		Env: c.Env, DeadlineMS: c.DeadlineMS, Warm: c.Warm, CreatedMS: now.UnixMilli(), Network: c.Network,
		FromCheckpoint: c.FromCheckpoint, FromMemory: c.FromMemory}
	if c.Network == spec.NetworkEgress {
		taken := map[int]bool{}
		for _, s := range h.sbx {
			if s.Link != nil {
				taken[s.Link.Slot] = true
			}
		}
		l, err := h.cfg.Egress.Plan(c.SandboxID, taken)
		if err != nil {
			h.cfg.Log.Warn("sandbox egress link refused", "sandbox_id", c.SandboxID, "err", err)
			return nil, errors.New("no-capacity")
		}
		st.Link = &l
	}
	if c.Runtime == spec.RuntimeRunc {
		used := map[uint32]bool{}
		for _, s := range h.sbx {
			if s.IDs.Valid() {
				used[s.IDs.Base] = true
			}
		}
		ids, err := allocIDRange(h.cfg.IDBase, h.cfg.IDSize, h.cfg.Slots, used)
		if err != nil {
			h.cfg.Log.Warn("sandbox id range refused", "sandbox_id", c.SandboxID, "err", err)
			return nil, errors.New("no-capacity")
		}
		st.IDs = ids
	}
	h.sbx[c.SandboxID] = st
	return st, nil
}

// launch fetches the image, makes the sandbox's user namespace and egress
// link, and starts it on the runtime. On failure it removes the sandbox
// and answers the reason the command fails with.
func (h *Host) launch(ctx context.Context, c spec.Create, st *State) error {
	fail := func(reason error) error {
		_ = h.remove(context.WithoutCancel(ctx), c.SandboxID)
		return reason
	}
	lower, err := h.cfg.Images.Ensure(ctx, c.ImageDigest)
	if err != nil {
		h.cfg.Log.Warn("sandbox image refused", "sandbox_id", c.SandboxID, "digest", c.ImageDigest, "err", err)
		return fail(imageReason(err))
	}
	rt := h.rts[c.Runtime]
	if rt == nil { // checkCreate refuses it first
		return fail(errors.New("runtime-unavailable"))
	}
	place := Placement{Lower: lower, IDs: st.IDs}
	nsPID := 0
	if un, ok := rt.(UserNamespaces); ok && st.IDs.Valid() {
		// The namespace's helper dies with the OS thread that started it
		// (Pdeathsig), and a thread ends when a goroutine locked to it
		// exits (the overlay mount, a preview's dial): this goroutine
		// keeps its thread, so no other can end it, until the helper is
		// closed (deferred below, so it runs before the unlock).
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		ns, err := un.NewUserNS(c.SandboxID, st.IDs)
		if err != nil {
			h.cfg.Log.Error("sandbox user namespace failed", "sandbox_id", c.SandboxID, "err", err)
			return fail(errors.New("start-failed"))
		}
		if ns != nil {
			defer ns.Close() // the sandbox holds the namespaces once started
			place.UserNS, nsPID = ns.Path, ns.PID
		}
	}
	if st.Link != nil {
		if err := h.cfg.Egress.Setup(ctx, c.SandboxID, *st.Link, nsPID); err != nil {
			h.cfg.Log.Error("sandbox egress link failed", "sandbox_id", c.SandboxID, "err", err)
			return fail(errors.New("start-failed"))
		}
		place.NetNS = st.Link.NetNSPath()
	}
	if c.FromCheckpoint != "" {
		place.Restore = h.restorer(ctx, c)
	}
	if c.FromMemory != "" {
		if place.Memory, err = h.memoryImage(ctx, c); err != nil {
			h.cfg.Log.Warn("sandbox memory image refused", "sandbox_id", c.SandboxID, "err", err)
			return fail(startReason(err))
		}
		defer os.RemoveAll(place.Memory)
	}
	if err := rt.Start(ctx, c, place); err != nil {
		h.cfg.Log.Error("sandbox start failed", "sandbox_id", c.SandboxID, "err", err)
		return fail(startReason(err))
	}
	return nil
}

func imageReason(err error) error {
	switch {
	case errors.Is(err, ErrDigestMismatch):
		return ErrDigestMismatch
	case errors.Is(err, ErrUnsafeImage):
		return ErrUnsafeImage
	}
	return errors.New("image-unavailable")
}

// Exec runs sandbox.exec: argv as signed, with the sandbox's environment,
// killed at the signed timeout or the sandbox's deadline, whichever is
// first.
func (h *Host) Exec(ctx context.Context, payload []byte) ([]byte, error) {
	var e spec.Exec
	if err := strictJSON(payload, &e); err != nil || e.Validate() != nil {
		return nil, errors.New("payload-invalid")
	}
	p, err := h.programFor(e.SandboxID)
	if err != nil {
		return nil, err
	}
	if p.unresolved != "" && len(e.EnvRefs) > 0 {
		// The values went with an earlier process (a bcd restart): this
		// exec names what the host may fetch again for it.
		if err := h.resolveForExec(ctx, e); err != nil {
			return nil, err
		}
		if p, err = h.programFor(e.SandboxID); err != nil {
			return nil, err
		}
	}
	if p.unresolved != "" {
		return nil, errors.New(p.unresolved)
	}
	env, root, left := p.env, p.root, p.left
	ectx, cancel := context.WithTimeout(ctx, min(time.Duration(e.TimeoutMS)*time.Millisecond, left))
	defer cancel()
	res, err := p.rt.Exec(ectx, e.SandboxID, e.Argv, env, root)
	if err != nil {
		h.cfg.Log.Warn("sandbox exec failed", "sandbox_id", e.SandboxID, "err", err)
		return nil, errors.New("exec-failed")
	}
	return json.Marshal(res)
}

// ReasonNotClaimed refuses a program in a warm sandbox: no signed update
// has handed it to a tenant yet.
const ReasonNotClaimed = "sandbox-not-claimed"

// program is what a program started in a sandbox gets: its environment
// (sorted), whether it runs as root, the time left to the deadline, and
// the runtime the sandbox runs on.
type program struct {
	env  []string
	root bool
	left time.Duration
	rt   Runtime
	// unresolved is set when the env names a secret or holds a sealed
	// value whose value this process does not hold (after a restart): a
	// program that would run without it is refused with this reason
	// (secret-unavailable, env-unavailable) rather than started with the
	// variable silently missing.
	unresolved string
}

// programFor reads what a program started in sandbox id now gets, or why
// none can start: the sandbox failed (sandbox-failed), is not on this
// host (sandbox-not-found), is still warm (sandbox-not-claimed: no
// tenant's signed update has handed it over yet; a claim answers before
// its update reaches the host), or its deadline passed (sandbox-expired).
func (h *Host) programFor(id string) (program, error) {
	h.mu.Lock()
	st, ok := h.sbx[id]
	var p program
	var deadline int64
	if ok {
		vars := map[string]string{}
		for k, v := range st.Env {
			if why := heldValue(v); why != "" {
				// Only the value resolved for this sandbox, never the
				// reference's text or the sealed form; none after a
				// restart (in memory only).
				val, ok := h.secretVals[id][v]
				if !ok {
					p.unresolved = why
					continue
				}
				v = val
			}
			vars[k] = v
		}
		if st.Link != nil {
			// The proxy's variables win over the template's: there is no
			// other way out.
			for k, v := range st.Link.Env() {
				vars[k] = v
			}
		}
		for k, v := range vars {
			p.env = append(p.env, k+"="+v)
		}
		p.root, deadline, p.rt = st.Root, st.DeadlineMS, h.rts[st.Runtime]
	}
	dead, warm := h.failed[id], ok && st.Warm
	h.mu.Unlock()
	switch {
	case dead:
		return p, errors.New("sandbox-failed")
	case !ok || p.rt == nil:
		return p, errors.New("sandbox-not-found")
	case warm:
		return p, errors.New(ReasonNotClaimed)
	}
	sort.Strings(p.env)
	if p.left = time.UnixMilli(deadline).Sub(h.cfg.Clock.Now()); p.left <= 0 {
		return p, errors.New("sandbox-expired")
	}
	return p, nil
}

// Update runs sandbox.update: a new deadline, and at claim the tenant's
// environment (a warm sandbox holds none before).
func (h *Host) Update(ctx context.Context, payload []byte) ([]byte, error) {
	var u spec.Update
	if err := strictJSON(payload, &u); err != nil || u.Validate() != nil {
		return nil, errors.New("payload-invalid")
	}
	var vals map[string]string
	if u.Claim {
		// Refused before any secret is fetched for it; checked again
		// below, under the lock, once the values are in.
		if err := h.warmHere(u.SandboxID); err != nil {
			return nil, err
		}
		var err error
		if vals, err = h.resolveEnv(ctx, u.SandboxID, u.Env, nil, nil); err != nil {
			return nil, err
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	st, ok := h.sbx[u.SandboxID]
	if !ok {
		return nil, errors.New("sandbox-not-found")
	}
	if u.DeadlineMS <= h.cfg.Clock.Now().UnixMilli() {
		return nil, errors.New("deadline-passed")
	}
	if u.Claim {
		if !st.Warm {
			return nil, errors.New("not-warm")
		}
		st.Warm, st.Env = false, u.Env
		st.SignedClaim = driver.CommandFrom(ctx)
		if len(vals) > 0 {
			h.secretVals[u.SandboxID] = vals
		}
	}
	st.DeadlineMS = u.DeadlineMS
	st.SignedUpdate = driver.CommandFrom(ctx)
	if err := h.save(st); err != nil {
		return nil, err
	}
	return json.Marshal(map[string]any{"sandbox_id": u.SandboxID, "deadline_ms": u.DeadlineMS})
}

// warmHere refuses a claim of a sandbox this host does not hold
// (sandbox-not-found) or holds claimed already (not-warm).
func (h *Host) warmHere(id string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	st, ok := h.sbx[id]
	switch {
	case !ok:
		return errors.New("sandbox-not-found")
	case !st.Warm:
		return errors.New("not-warm")
	}
	return nil
}

// Delete runs sandbox.delete; deleting a sandbox the host does not have
// succeeds (it is gone either way).
func (h *Host) Delete(ctx context.Context, payload []byte) ([]byte, error) {
	var d spec.Delete
	if err := strictJSON(payload, &d); err != nil || spec.ValidSandboxID(d.SandboxID) != nil {
		return nil, errors.New("payload-invalid")
	}
	if err := h.remove(ctx, d.SandboxID); err != nil {
		h.cfg.Log.Error("sandbox remove failed", "sandbox_id", d.SandboxID, "err", err)
		return nil, errors.New("remove-failed")
	}
	h.mu.Lock()
	delete(h.failed, d.SandboxID)
	h.mu.Unlock()
	return json.Marshal(map[string]any{"sandbox_id": d.SandboxID, "deleted": true})
}

// remove stops and deletes a sandbox on its runtime, then its egress
// link, then its state. A sandbox the host does not hold is removed from
// every runtime (whatever a crash left of it).
func (h *Host) remove(ctx context.Context, id string) error {
	rts := []Runtime{h.runtimeOf(id)}
	if rts[0] == nil && !h.holds(id) {
		rts = rts[:0]
		for _, n := range h.names {
			rts = append(rts, h.rts[n])
		}
	}
	for _, rt := range rts {
		if rt == nil {
			continue // its runtime is not on this host: nothing runs it
		}
		if err := rt.Remove(ctx, id); err != nil {
			return err
		}
	}
	h.mu.Lock()
	var link *Link
	if st, ok := h.sbx[id]; ok {
		link = st.Link
	}
	h.mu.Unlock()
	if link != nil {
		var err error
		if h.cfg.Egress != nil {
			err = h.cfg.Egress.Teardown(ctx, id, *link)
		} else {
			err = RemoveLink(ctx, *link)
		}
		if err != nil {
			return err
		}
	}
	if err := os.Remove(h.statePath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("sandbox: remove state: %w", err)
	}
	h.forget(id)
	return nil
}

// starting reports whether sandbox id is being created (its runtime
// instance may not exist yet).
func (h *Host) starting(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	st, ok := h.sbx[id]
	return ok && !st.started
}

// holds reports whether the host has state for sandbox id.
func (h *Host) holds(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.sbx[id]
	return ok
}

func (h *Host) forget(id string) {
	h.mu.Lock()
	delete(h.sbx, id)
	delete(h.secretVals, id)
	h.mu.Unlock()
}

// ReasonSecretUnavailable is the reason a create or claim fails when a
// secret reference its env names could not be resolved through the
// broker (refused, or no broker on this path: the root helper's).
const ReasonSecretUnavailable = "secret-unavailable"

// keepSecrets holds sandbox id's resolved secret values in memory.
func (h *Host) keepSecrets(id string, vals map[string]string) {
	if len(vals) == 0 {
		return
	}
	h.mu.Lock()
	h.secretVals[id] = vals
	h.mu.Unlock()
}

// Sweep stops and removes every sandbox past its deadline and returns how
// many it removed. It needs no session: the deadline is the one signed.
// It also removes every sandbox whose runtime instance died (gVisor's
// kernel killed at a limit), which then answers sandbox-failed.
func (h *Host) Sweep(ctx context.Context) int {
	now := h.cfg.Clock.Now().UnixMilli()
	var expired, alive []string
	h.mu.Lock()
	for id, st := range h.sbx {
		if st.DeadlineMS <= now {
			expired = append(expired, id)
		} else {
			alive = append(alive, id)
		}
	}
	h.mu.Unlock()
	for _, id := range alive {
		lv, ok := h.runtimeOf(id).(Liveness)
		if !ok || h.starting(id) || lv.Alive(id) {
			continue
		}
		h.cfg.Log.Error("sandbox runtime died, removing it", "sandbox_id", id)
		if err := h.remove(ctx, id); err != nil {
			h.cfg.Log.Error("dead sandbox not removed", "sandbox_id", id, "err", err)
			continue
		}
		h.mu.Lock()
		h.failed[id] = true
		f := h.onFailed
		h.mu.Unlock()
		if f != nil {
			f(id, ReasonRuntimeDied)
		}
	}
	n := 0
	for _, id := range expired {
		if err := h.remove(ctx, id); err != nil {
			h.cfg.Log.Error("expired sandbox not removed", "sandbox_id", id, "err", err)
			continue
		}
		h.cfg.Log.Info("sandbox expired and removed", "sandbox_id", id)
		n++
	}
	return n
}

// Run sweeps every interval until ctx ends.
func (h *Host) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			h.Sweep(ctx)
		}
	}
}

// Sandboxes returns the ids the host holds, sorted.
func (h *Host) Sandboxes() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]string, 0, len(h.sbx))
	for id := range h.sbx {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// Get returns a copy of a sandbox's state.
func (h *Host) Get(id string) (State, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	st, ok := h.sbx[id]
	if !ok {
		return State{}, false
	}
	return *st, true
}

// strictJSON decodes a signed payload, refusing unknown fields.
func strictJSON(b []byte, v any) error {
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}
