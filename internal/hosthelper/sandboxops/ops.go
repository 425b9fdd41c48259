// Package sandboxops runs the sandbox.* commands in the root helper: the
// node agent, unprivileged, hands over the signed command the control
// plane sent, never a bundle path, an argv or a sandbox id of its own.
// The helper verifies the command itself, under roots, a node id, a role
// and allowed kinds it takes from its own trust (the signed desired state
// it checked, the roots it pinned), refuses a command it has admitted
// before (its own replay store, kept across restarts), checks that the
// operation asked for is the command's kind, and only then runs the
// sandbox host (internal/daemon/sandbox.Host) on the signed payload. The
// host lives in the helper's own state directory with the helper's own
// image store and egress settings.
package sandboxops

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"sort"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/daemon/sandbox"
	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// Reasons of a CodeCommand refusal besides the daemon's own (daemon.Reason*).
const (
	// ReasonOpKindMismatch: the signed command's kind is not the one the
	// operation runs (a sandbox.exec command sent as sandbox.create).
	ReasonOpKindMismatch = "op-kind-mismatch"
	// ReasonCommandID: the command's id is empty or longer than
	// MaxCommandID bytes.
	ReasonCommandID = "command-id-invalid"
)

// MaxCommandID is the longest command id the helper admits (as the node).
const MaxCommandID = 64

// MaxFailures bounds the dead sandboxes the helper keeps for the node.
const MaxFailures = 4096

// Trust is what the helper trusts when it checks a sandbox command. All
// of it comes from the helper's own configuration and the desired state
// it verified itself, never from the node's word.
type Trust struct {
	NodeID      string
	TrustDomain string
	// Roots are the command-signing roots the helper pinned or took from
	// a trust bundle it verified.
	Roots []*x509.Certificate
	// Role and AllowedKinds are the signed desired state's host section:
	// a kind runs only when kinds.Permitted(Role, AllowedKinds, kind).
	// A nil AllowedKinds means the role's kinds.
	Role         string
	AllowedKinds []string
}

// TrustFunc returns the Trust to check req's command under, or the
// refusal of req (a *helperwire.Refusal, e.g. the desired-state checker's
// intent-* codes). The lead wires the desired-state checker here.
type TrustFunc func(ctx context.Context, req *helperwire.Request) (Trust, error)

// Handler is one operation's handler, as the helper's server calls it.
type Handler func(ctx context.Context, req *helperwire.Request) (json.RawMessage, error)

// Config configures Ops.
type Config struct {
	// Host is the helper's sandbox host, opened on the helper's own state
	// directory, image store and egress settings.
	Host *sandbox.Host
	// Trust supplies what commands are checked under; required.
	Trust TrustFunc
	// StateDir is the helper's directory for this package (the replay
	// store lives in StateDir/seen).
	StateDir string
	Clock    clock.Clock
	Log      *slog.Logger
	// Extra are more signed-command operations admitted exactly like the
	// sandbox ones (ssh.access, say): op → the one kind it runs and what
	// runs the verified payload.
	Extra map[string]Runner
}

// Runner is one extra operation: the command kind it admits and what
// runs the verified payload.
type Runner struct {
	Kind string
	Do   func(ctx context.Context, payload []byte) ([]byte, error)
}

// Ops holds the sandbox operations' handlers.
type Ops struct {
	cfg    Config
	seen   *Seen
	chains *pki.WorkerChainCache
	kinds  map[string]string // op → the one kind it admits

	// adoptMu serialises Adopt; adopted are the sandboxes its first call
	// adopted (adoptDone once it ran).
	adoptMu   sync.Mutex
	adopted   []string
	adoptDone bool

	mu        sync.Mutex
	failures  map[string]string // sandbox id → reason, until deleted
	dropped   int
	lastPrune time.Time
}

// New opens the replay store under cfg.StateDir, prunes it, and registers
// with the host to be told of the sandboxes its sweep finds dead.
func New(cfg Config) (*Ops, error) {
	if (cfg.Host == nil && len(cfg.Extra) == 0) || cfg.Trust == nil || cfg.StateDir == "" {
		return nil, errors.New("sandboxops: a host or extra operations, a trust function and a state directory are required")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	seen, err := OpenSeen(cfg.StateDir + "/seen")
	if err != nil {
		return nil, err
	}
	o := &Ops{cfg: cfg, seen: seen, chains: pki.NewWorkerChainCache(0), failures: map[string]string{}, kinds: map[string]string{}}
	if cfg.Host != nil {
		maps.Copy(o.kinds, opKind)
	}
	for op, r := range cfg.Extra {
		o.kinds[op] = r.Kind
	}
	o.prune()
	if cfg.Host != nil {
		cfg.Host.OnFailed(o.noteFailure)
	}
	return o, nil
}

// Handlers returns the handler of each operation this package serves.
// sandbox.create, .exec, .update, .delete and .checkpoint change the host (the server
// requires a signed desired state on them); sandbox.labels and
// sandbox.failures only read.
func (o *Ops) Handlers() map[string]Handler {
	h := map[string]Handler{}
	if o.cfg.Host != nil {
		h[helperwire.OpSandboxCreate], h[helperwire.OpSandboxExec] = o.Create, o.Exec
		h[helperwire.OpSandboxUpdate], h[helperwire.OpSandboxDelete] = o.Update, o.Delete
		h[helperwire.OpSandboxLabels], h[helperwire.OpSandboxFailures] = o.Labels, o.Failures
		h[helperwire.OpSandboxCheckpoint] = o.Checkpoint
		h[helperwire.OpSandboxAdopt] = o.Adopt
	}
	for op, r := range o.cfg.Extra {
		h[op] = func(ctx context.Context, req *helperwire.Request) (json.RawMessage, error) {
			return o.run(ctx, op, req, r.Do)
		}
	}
	return h
}

// ChangesHost reports whether op changes the host (runs a signed command,
// or adopts: adoption kills what it cannot match).
func (o *Ops) ChangesHost(op string) bool {
	return o.kinds[op] != "" || (op == helperwire.OpSandboxAdopt && o.cfg.Host != nil)
}

// Adopt runs OpSandboxAdopt: the first call has the host adopt what it
// found running at open (sandbox.Host.Adopt), each sandbox's kept signed
// commands verified again as the node's verifier would (daemon.Verifier
// CheckKept) under the helper's own Trust; every call answers the
// adopted sandboxes the host still holds.
func (o *Ops) Adopt(ctx context.Context, req *helperwire.Request) (json.RawMessage, error) {
	tr, err := o.cfg.Trust(ctx, req)
	if err != nil {
		return nil, err
	}
	if len(tr.Roots) == 0 || tr.TrustDomain == "" || tr.NodeID == "" {
		return nil, refuse(daemon.ReasonSignerUntrusted)
	}
	v := &daemon.Verifier{NodeID: tr.NodeID, Role: tr.Role, TrustDomain: tr.TrustDomain, CommandRoots: tr.Roots, WorkerChains: o.chains}
	o.adoptMu.Lock()
	if !o.adoptDone {
		o.adopted, o.adoptDone = o.cfg.Host.Adopt(ctx, v.CheckKept), true
	}
	out := helperwire.SandboxAdopted{SandboxIDs: []string{}}
	for _, id := range o.adopted {
		if _, held := o.cfg.Host.Get(id); held {
			out.SandboxIDs = append(out.SandboxIDs, id)
		}
	}
	o.adoptMu.Unlock()
	b, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("sandboxops: adopted: %w", err)
	}
	return b, nil
}

// opKind is the one command kind each changing operation runs.
var opKind = map[string]string{
	helperwire.OpSandboxCreate: kinds.SandboxCreate,
	helperwire.OpSandboxExec:   kinds.SandboxExec,
	helperwire.OpSandboxUpdate: kinds.SandboxUpdate,
	helperwire.OpSandboxDelete: kinds.SandboxDelete,
	// sandbox.checkpoint changes the host: it pauses the sandbox and
	// writes to the store.
	helperwire.OpSandboxCheckpoint: kinds.SandboxCheckpoint,
}

// Create runs a verified sandbox.create command.
func (o *Ops) Create(ctx context.Context, req *helperwire.Request) (json.RawMessage, error) {
	return o.run(ctx, helperwire.OpSandboxCreate, req, o.cfg.Host.Create)
}

// Exec runs a verified sandbox.exec command and answers its output.
func (o *Ops) Exec(ctx context.Context, req *helperwire.Request) (json.RawMessage, error) {
	return o.run(ctx, helperwire.OpSandboxExec, req, o.cfg.Host.Exec)
}

// Update runs a verified sandbox.update command.
func (o *Ops) Update(ctx context.Context, req *helperwire.Request) (json.RawMessage, error) {
	return o.run(ctx, helperwire.OpSandboxUpdate, req, o.cfg.Host.Update)
}

// Checkpoint runs a verified sandbox.checkpoint command and answers
// what it stored (spec.CheckpointResult).
func (o *Ops) Checkpoint(ctx context.Context, req *helperwire.Request) (json.RawMessage, error) {
	return o.run(ctx, helperwire.OpSandboxCheckpoint, req, o.cfg.Host.Checkpoint)
}

// Delete runs a verified sandbox.delete command; a deleted sandbox leaves
// the failures list.
func (o *Ops) Delete(ctx context.Context, req *helperwire.Request) (json.RawMessage, error) {
	res, err := o.run(ctx, helperwire.OpSandboxDelete, req, o.cfg.Host.Delete)
	if err == nil {
		var d spec.Delete
		if json.Unmarshal(o.lastPayload(req), &d) == nil {
			o.mu.Lock()
			delete(o.failures, d.SandboxID)
			o.mu.Unlock()
		}
	}
	return res, err
}

// lastPayload returns the payload of req's command, which run verified.
func (o *Ops) lastPayload(req *helperwire.Request) []byte {
	var c nodev1.SignedCommand
	var b nodev1.CommandBody
	if proto.Unmarshal(req.Command, &c) != nil || proto.Unmarshal(c.Body, &b) != nil {
		return nil
	}
	return b.Payload
}

// run admits req's command for op and runs it on the host with the
// signed payload. A host error becomes a CodeFailed refusal whose reason
// is the host's reason when that is a reason token (no-capacity,
// sandbox-not-found, ...), else "failed" (the detail is logged here).
func (o *Ops) run(ctx context.Context, op string, req *helperwire.Request, do func(context.Context, []byte) ([]byte, error)) (json.RawMessage, error) {
	body, err := o.admit(ctx, op, req)
	if err != nil {
		return nil, err
	}
	o.cfg.Log.Info("sandbox command admitted", "op", op, "command_id", body.CommandId)
	// The host keeps the signed command a sandbox's state is written
	// from, to verify it again when it adopts the sandbox.
	res, err := do(driver.WithCommand(withEnvValues(ctx, req.EnvValues), req.Command), body.Payload)
	for _, v := range req.EnvValues {
		clear(v)
	}
	if err != nil {
		reason := err.Error()
		if !reasonToken.MatchString(reason) {
			o.cfg.Log.Error("sandbox command failed", "op", op, "command_id", body.CommandId, "err", err)
			reason = helperwire.CodeFailed
		}
		return nil, &helperwire.Refusal{Code: helperwire.CodeFailed, Reason: reason}
	}
	return res, nil
}

// withEnvValues returns ctx with a secret fetcher answering from vals
// (the sandbox env keys the node fetched through the broker for the
// command), or ctx as it is when there are none. It answers env key
// references only (spec.EnvKeyRef): a key the node made up opens no
// value sealed in the signed payload, whereas a secret's value the node
// handed over could not be checked, so secret references stay refused
// here (the host has no broker path: secret-unavailable).
func withEnvValues(ctx context.Context, vals map[string][]byte) context.Context {
	if len(vals) == 0 {
		return ctx
	}
	return driver.WithSecrets(ctx, func(_ context.Context, ref string) ([]byte, error) {
		v, ok := vals[ref]
		if _, _, key := spec.ParseEnvKeyRef(ref); !ok || !key {
			return nil, errors.New("sandboxops: not fetched for the command")
		}
		return append([]byte(nil), v...), nil
	})
}

// reasonToken is the shape of a reason the host gives the control plane.
var reasonToken = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)

func refuse(reason string) error {
	return &helperwire.Refusal{Code: helperwire.CodeCommand, Reason: reason}
}

// admit decodes and verifies req's signed command for op, as the node
// does (daemon.Verifier.Check: signer chained to the roots, signature,
// id, this node, fresh, not replayed, kind permitted) but under the
// helper's own Trust and replay store, then checks that the command's
// kind is op's and claims its id. It answers the verified body or a
// CodeCommand refusal carrying the reason.
func (o *Ops) admit(ctx context.Context, op string, req *helperwire.Request) (*nodev1.CommandBody, error) {
	if len(req.Command) == 0 {
		return nil, refuse(daemon.ReasonSignatureMissing)
	}
	var c nodev1.SignedCommand
	if err := proto.Unmarshal(req.Command, &c); err != nil {
		return nil, refuse(daemon.ReasonBodyMalformed)
	}
	if c.Id == "" || len(c.Id) > MaxCommandID {
		return nil, refuse(ReasonCommandID)
	}
	tr, err := o.cfg.Trust(ctx, req)
	if err != nil {
		return nil, err
	}
	switch {
	case len(tr.Roots) == 0 || tr.TrustDomain == "":
		return nil, refuse(daemon.ReasonSignerUntrusted)
	case tr.NodeID == "":
		return nil, refuse(daemon.ReasonWrongNode)
	}
	v := daemon.Verifier{NodeID: tr.NodeID, Role: tr.Role, TrustDomain: tr.TrustDomain, CommandRoots: tr.Roots, WorkerChains: o.chains}
	body, reason := v.Check(&c, o.cfg.Clock.Now(), tr.AllowedKinds, o.seen.Has)
	switch {
	case reason != "":
		return nil, o.refused(op, c.Id, reason)
	case body.Kind != o.kinds[op]:
		return nil, o.refused(op, c.Id, ReasonOpKindMismatch)
	}
	o.prune()
	fresh, err := o.seen.Claim(c.Id, time.UnixMilli(body.ExpiresAtMs))
	if err != nil {
		return nil, err
	}
	if !fresh {
		return nil, o.refused(op, c.Id, daemon.ReasonReplayed)
	}
	return body, nil
}

// refused logs a refused command and returns its refusal.
func (o *Ops) refused(op, id, reason string) error {
	o.cfg.Log.Warn("sandbox command refused", "op", op, "command_id", id, "reason", reason)
	return refuse(reason)
}

// prune prunes the replay store at most once a minute of the helper's
// clock.
func (o *Ops) prune() {
	now := o.cfg.Clock.Now()
	o.mu.Lock()
	due := now.Sub(o.lastPrune) >= time.Minute || now.Before(o.lastPrune)
	if due {
		o.lastPrune = now
	}
	o.mu.Unlock()
	if !due {
		return
	}
	if _, err := o.seen.Prune(now); err != nil {
		o.cfg.Log.Warn("sandbox replay store not pruned", "err", err)
	}
}

// Labels answers the host's capability labels (helperwire.SandboxLabels).
func (o *Ops) Labels(context.Context, *helperwire.Request) (json.RawMessage, error) {
	b, err := json.Marshal(helperwire.SandboxLabels{Labels: o.cfg.Host.Labels()})
	if err != nil {
		return nil, fmt.Errorf("sandboxops: labels: %w", err)
	}
	return b, nil
}

// noteFailure keeps a sandbox the host's sweep found dead, for the node.
func (o *Ops) noteFailure(id, reason string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.failures[id]; !ok && len(o.failures) >= MaxFailures {
		o.dropped++
		o.cfg.Log.Error("sandbox failure not kept, list full", "sandbox_id", id, "reason", reason)
		return
	}
	o.failures[id] = reason
}

// Failures answers the dead sandboxes not deleted since
// (helperwire.SandboxFailures); it changes nothing.
func (o *Ops) Failures(context.Context, *helperwire.Request) (json.RawMessage, error) {
	o.mu.Lock()
	out := helperwire.SandboxFailures{Failures: []helperwire.SandboxFailure{}, Dropped: o.dropped}
	for id, r := range o.failures {
		out.Failures = append(out.Failures, helperwire.SandboxFailure{SandboxID: id, Reason: r})
	}
	o.mu.Unlock()
	sort.Slice(out.Failures, func(i, j int) bool { return out.Failures[i].SandboxID < out.Failures[j].SandboxID })
	b, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("sandboxops: failures: %w", err)
	}
	return b, nil
}
