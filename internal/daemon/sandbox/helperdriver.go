package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// HelperCaller makes one call to the root helper (helperwire.Client's
// Call): a *helperwire.Refusal error is the helper's refusal.
type HelperCaller interface {
	Call(ctx context.Context, req *helperwire.Request) (json.RawMessage, error)
}

// ErrNoSignedCommand is the reason a sandbox command fails when the
// daemon did not put its verified signed command in the context
// (driver.WithCommand): the helper runs nothing on the node's word alone,
// so the node never calls it without one.
var ErrNoSignedCommand = errors.New("signed-command-missing")

// ErrShellUnprivileged is OpenShell's error on an unprivileged node: an
// interactive exec needs a terminal made in the sandbox, which only the
// root helper could make and hand over (file-descriptor passing over the
// helper's socket), and that is not built. It wraps
// driver.ErrShellUnsupported, so the node answers exec-unsupported.
var ErrShellUnprivileged = fmt.Errorf("interactive exec is not available on an unprivileged node: %w", driver.ErrShellUnsupported)

// LabelsTimeout bounds the helper call HelperDriver.Labels makes.
const LabelsTimeout = 10 * time.Second

// HelperDriver is Driver for an unprivileged node: the sandbox.* kinds
// run in the root helper, which verifies the signed command again under
// its own roots (internal/hosthelper/sandboxops), and every other kind on
// the wrapped driver.
type HelperDriver struct {
	driver.Driver
	Client HelperCaller
	// Intent returns the last signed desired state the node verified
	// (Request.Intent); nil sends none.
	Intent func() []byte
	// Bundle returns the signed trust bundle the node holds
	// (Request.Bundle); nil sends none.
	Bundle func() []byte
	Clock  clock.Clock  // paces WatchFailures; nil is the real clock
	Log    *slog.Logger // nil is slog.Default()

	mu       sync.Mutex
	onFailed func(sandboxID, reason string)
	reported map[string]bool // failures already passed to onFailed
}

// Run sends a verified sandbox or ssh.access command to the helper with the signed
// command from ctx, and runs every other kind on the wrapped driver. A
// helper's CodeFailed refusal fails the command with the host's own
// reason (as an in-process host gives it); any other refusal fails it
// with the refusal (code and reason).
func (d *HelperDriver) Run(ctx context.Context, kind string, payload []byte) ([]byte, error) {
	switch kind {
	case kinds.SandboxCreate, kinds.SandboxExec, kinds.SandboxUpdate, kinds.SandboxDelete, kinds.SandboxCheckpoint, kinds.SSHAccess:
	default:
		return d.Driver.Run(ctx, kind, payload)
	}
	signed := driver.CommandFrom(ctx)
	if len(signed) == 0 {
		return nil, ErrNoSignedCommand
	}
	req := &helperwire.Request{Op: kind, Command: signed}
	if kind == kinds.SandboxCreate || kind == kinds.SandboxUpdate {
		req.EnvValues = d.fetchEnv(ctx, helperEnvRefs(kind, payload))
	}
	res, err := d.call(ctx, req)
	if kind == kinds.SandboxExec && envRefused(err) {
		// The helper's host no longer holds the env's values (it
		// restarted): fetch what the exec names and try once more.
		if vals := d.fetchEnv(ctx, helperEnvRefs(kind, payload)); len(vals) > 0 {
			req.EnvValues = vals
			res, err = d.call(ctx, req)
		}
	}
	for _, v := range req.EnvValues {
		clear(v)
	}
	if err != nil {
		var r *helperwire.Refusal
		if errors.As(err, &r) && r.Code == helperwire.CodeFailed && r.Reason != "" {
			return nil, errors.New(r.Reason)
		}
		return nil, fmt.Errorf("sandbox: helper: %w", err)
	}
	return res, nil
}

// call fills in the version, intent and bundle and calls the helper.
func (d *HelperDriver) call(ctx context.Context, req *helperwire.Request) (json.RawMessage, error) {
	req.Version = helperwire.Version
	if d.Intent != nil {
		req.Intent = d.Intent()
	}
	if d.Bundle != nil {
		req.Bundle = d.Bundle()
	}
	return d.Client.Call(ctx, req)
}

func (d *HelperDriver) log() *slog.Logger {
	if d.Log == nil {
		return slog.Default()
	}
	return d.Log
}

// Labels are the helper's sandbox host's capability labels; when the
// helper cannot be asked, none (the node then advertises no sandbox
// capability it cannot show).
func (d *HelperDriver) Labels() map[string]string {
	ctx, cancel := context.WithTimeout(context.Background(), LabelsTimeout)
	defer cancel()
	raw, err := d.call(ctx, &helperwire.Request{Op: helperwire.OpSandboxLabels})
	var l helperwire.SandboxLabels
	if err == nil {
		err = json.Unmarshal(raw, &l)
	}
	if err != nil {
		d.log().Warn("sandbox labels not read from the helper", "err", err)
		return nil
	}
	return l.Labels
}

// OnSandboxFailed sets f to be told of each sandbox the helper found dead
// (see PollFailures); a later call replaces f.
func (d *HelperDriver) OnSandboxFailed(f func(sandboxID, reason string)) {
	d.mu.Lock()
	d.onFailed = f
	d.mu.Unlock()
}

// PollFailures asks the helper once for its dead sandboxes and tells the
// OnSandboxFailed function of each one it has not told of before in this
// process. The helper's list is level-triggered, so after a restart of
// the node every one still listed is told again (the control plane takes
// a repeated report as a no-op).
func (d *HelperDriver) PollFailures(ctx context.Context) error {
	raw, err := d.call(ctx, &helperwire.Request{Op: helperwire.OpSandboxFailures})
	if err != nil {
		return fmt.Errorf("sandbox: helper failures: %w", err)
	}
	var fs helperwire.SandboxFailures
	if err := json.Unmarshal(raw, &fs); err != nil {
		return fmt.Errorf("sandbox: helper failures: %w", err)
	}
	d.mu.Lock()
	f, prev := d.onFailed, d.reported
	var tell []helperwire.SandboxFailure
	d.reported = map[string]bool{}
	for _, x := range fs.Failures {
		d.reported[x.SandboxID] = true
		if !prev[x.SandboxID] {
			tell = append(tell, x)
		}
	}
	if f == nil {
		d.reported = prev // nobody told yet: tell them once a function is set
	}
	d.mu.Unlock()
	if f != nil {
		for _, x := range tell {
			f(x.SandboxID, x.Reason)
		}
	}
	return nil
}

// WatchFailures polls the helper every interval until ctx ends; a failed
// poll is logged and retried at the next tick.
func (d *HelperDriver) WatchFailures(ctx context.Context, every time.Duration) {
	clk := d.Clock
	if clk == nil {
		clk = clock.Real{}
	}
	t := clk.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			if err := d.PollFailures(ctx); err != nil {
				d.log().Warn("sandbox failures not polled", "err", err)
			}
		}
	}
}

// ErrNoIntentYet is AdoptSandboxes' error before the node holds a
// desired state to send: adoption in the helper changes the host, so the
// helper refuses it without one; the node asks again later.
var ErrNoIntentYet = errors.New("sandbox: no desired state to send the helper yet")

// AdoptSandboxes has the helper adopt what its host found running at
// open, verified under the helper's own trust (check, the node's
// verifier, is not used: the helper verifies itself), and returns the
// adopted sandboxes the helper's host still holds. The ones it killed
// come back through PollFailures.
func (d *HelperDriver) AdoptSandboxes(ctx context.Context, _ func(signed []byte, kind string) ([]byte, error)) ([]string, error) {
	if d.Intent == nil || len(d.Intent()) == 0 {
		return nil, ErrNoIntentYet
	}
	raw, err := d.call(ctx, &helperwire.Request{Op: helperwire.OpSandboxAdopt})
	if err != nil {
		return nil, fmt.Errorf("sandbox: helper adopt: %w", err)
	}
	var a helperwire.SandboxAdopted
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, fmt.Errorf("sandbox: helper adopt: %w", err)
	}
	return a.SandboxIDs, nil
}

// OpenShell refuses: see ErrShellUnprivileged.
func (d *HelperDriver) OpenShell(context.Context, string, []string) (driver.Shell, error) {
	return nil, ErrShellUnprivileged
}

// helperEnvRefs returns the env key references (spec.EnvKeyRef) a
// verified sandbox command's host needs from the broker: a create's or
// claim's, for its sealed values, and those an exec's env refs name. The
// node fetches them for the helper's host: a key the node made up opens
// no value sealed in the signed payload (the host refuses it
// env-unavailable). Secret references are not passed: their values could
// not be checked against anything signed, so the helper's host keeps
// refusing them (secret-unavailable).
func helperEnvRefs(kind string, payload []byte) []string {
	var p struct {
		SandboxID string            `json:"sandbox_id"`
		Env       map[string]string `json:"env"`
		EnvRefs   []string          `json:"env_refs"`
	}
	if json.Unmarshal(payload, &p) != nil {
		return nil
	}
	var refs []string
	add := func(ref string) {
		if _, _, ok := spec.ParseEnvKeyRef(ref); ok && !slices.Contains(refs, ref) {
			refs = append(refs, ref)
		}
	}
	if kind == kinds.SandboxExec {
		for _, ref := range p.EnvRefs {
			add(ref)
		}
		return refs
	}
	for _, v := range p.Env {
		if tenant, ok := spec.SealedEnvTenant(v); ok {
			add(spec.EnvKeyRef(tenant, p.SandboxID))
		}
	}
	return refs
}

// fetchEnv fetches refs through the broker for the command being run
// (driver.SecretsFrom), for the helper's host: what the broker refuses is
// left out (the host then refuses the command by reason). It logs no
// value.
func (d *HelperDriver) fetchEnv(ctx context.Context, refs []string) map[string][]byte {
	fetch := driver.SecretsFrom(ctx)
	if fetch == nil || len(refs) == 0 {
		return nil
	}
	vals := map[string][]byte{}
	for _, ref := range refs {
		b, err := fetch(ctx, ref)
		if err != nil {
			d.log().Warn("sandbox env reference refused for the helper")
			continue
		}
		vals[ref] = b
	}
	return vals
}

// envRefused reports whether err is the helper's refusal of a program
// for want of a sealed env value (env-unavailable).
func envRefused(err error) bool {
	var r *helperwire.Refusal
	return errors.As(err, &r) && r.Code == helperwire.CodeFailed && r.Reason == spec.ReasonEnvUnavailable
}
