package devenv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"time"

	"github.com/bettercompute/bettercompute/internal/bastion/agent"
	"github.com/bettercompute/bettercompute/internal/bastion/forward"
	"github.com/bettercompute/bettercompute/internal/bastion/grant"
	"github.com/bettercompute/bettercompute/internal/bastions"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/iam"
)

// Dev's bastion: DATA/bastion, named dev-bastion, in the root tenant.
const (
	bastionDir  = "bastion"
	bastionName = "dev-bastion"
	// grantMargin: a dev grant expiring sooner than this is replaced at
	// start, so a dev session does not lose it midway.
	grantMargin = time.Hour
)

// startBastion starts the fake model server, pairs dev's bastion on the
// first run, runs it (the real agent: mutual TLS to the gateway, the
// user-space WireGuard tunnel, the forward filter) until Close, grants it
// inference on FakeModelPublic only, and returns once the tunnel has
// handshaken and the bastion holds the grant.
func (e *Env) startBastion(ctx context.Context, o Options) error {
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	fm, err := startFakeModel(o.Clock, log)
	if err != nil {
		return err
	}
	e.stop = append([]func(){fm.close}, e.stop...)
	dir := filepath.Join(o.DataDir, bastionDir)
	if err := e.pairBastion(ctx, dir); err != nil {
		return err
	}
	a, err := agent.Open(ctx, agent.Config{DataDir: dir, Gateway: e.CP.GatewayAddr, Clock: o.Clock, Log: log,
		Forwards: map[forward.Kind]string{forward.KindOllama: fm.addr}})
	if errors.Is(err, agent.ErrUnpaired) {
		return fmt.Errorf("dev bastion: %s: %w", dir, errors.Join(ErrBastionUnpaired, err))
	}
	if err != nil {
		return fmt.Errorf("dev bastion: %w", err)
	}
	if err := e.checkPaired(ctx, a.ID()); err != nil {
		_ = a.Close()
		return fmt.Errorf("dev bastion: %s: %w", dir, err)
	}
	done := e.runBastion(ctx, a, log)
	e.BastionID = a.ID()
	if err := waitUntil(ctx, done, "the bastion's tunnel handshake", func() bool { return e.CP.Lanes.Connected(a.ID()) }); err != nil {
		return err
	}
	if err := e.ensureGrant(ctx, a.ID(), o); err != nil {
		return err
	}
	if err := waitUntil(ctx, done, "the bastion to hold its inference grant", func() bool { return a.Policy().Allows(grant.FamilyInference) }); err != nil {
		return err
	}
	e.BastionHint = bastionHint(a.ID(), fm.addr, dir)
	return nil
}

// pairBastion pairs DATA/bastion with a one-time pairing token from the
// bastions module, unless it joined already.
func (e *Env) pairBastion(ctx context.Context, dir string) error {
	if daemon.Joined(dir) {
		return nil
	}
	tok, err := e.CP.Bastions.PairToken(ctx, devActor, bastionName, 10*time.Minute)
	if err != nil {
		return fmt.Errorf("dev bastion: pairing token: %w", err)
	}
	if _, err := agent.Pair(ctx, dir, e.CP.GatewayAddr, tok.Token, bastionName); err != nil {
		return fmt.Errorf("dev bastion: pair: %w", err)
	}
	return nil
}

// ErrBastionUnpaired is Start's error when DATA/bastion holds a bastion
// the control plane unpaired: dev does not pair a new one behind the
// person's back (remove DATA/bastion to pair a new one).
var ErrBastionUnpaired = errors.New("bastion-unpaired: dev's bastion was unpaired; remove its data folder to pair a new one")

// checkPaired refuses (ErrBastionUnpaired) a bastion the bastions module
// does not hold as paired: its sessions would be refused forever.
func (e *Env) checkPaired(ctx context.Context, id string) error {
	b, err := e.CP.Bastions.Get(ctx, iam.RootScope(), id)
	if err != nil {
		return fmt.Errorf("read the bastion: %w", err)
	}
	if b.State != bastions.StatePaired {
		return ErrBastionUnpaired
	}
	return nil
}

// runBastion runs a until Close (which stops it before the control
// plane). The returned channel gets Run's result should it end first.
func (e *Env) runBastion(ctx context.Context, a *agent.Agent, log *slog.Logger) <-chan error {
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		err := a.Run(rctx)
		if err != nil {
			log.Error("dev bastion stopped", "bastion_id", a.ID(), "err", err)
		}
		done <- err
	}()
	e.stop = append([]func(){func() {
		cancel()
		<-stopped
		_ = a.Close()
	}}, e.stop...)
	return done
}

// ensureGrant grants bastion id inference on FakeModelPublic alone,
// unless a live grant dev made with exactly that scope stays valid for
// grantMargin more.
func (e *Env) ensureGrant(ctx context.Context, id string, o Options) error {
	want := bastions.GrantRequest{Allow: []string{grant.FamilyInference}, Models: []string{FakeModelPublic}}
	gs, err := e.CP.Bastions.Grants(ctx, iam.RootScope(), id)
	if err != nil {
		return fmt.Errorf("dev bastion: grants: %w", err)
	}
	for _, g := range gs {
		if !g.Revoked && !g.Expired && g.CreatedBy == devActor.Actor && o.Clock.Now().Add(grantMargin).Before(g.ExpiresAt) &&
			slices.Equal(g.Allow, want.Allow) && slices.Equal(g.Models, want.Models) && len(g.Deny) == 0 && len(g.Reach) == 0 {
			return nil
		}
	}
	if _, err := e.CP.Bastions.Grant(ctx, devActor, iam.RootScope(), id, want); err != nil {
		return fmt.Errorf("dev bastion: grant: %w", err)
	}
	return nil
}

// waitUntil polls cond until it holds, failing when the bastion's Run
// ends, ctx ends or connectTimeout passes.
func waitUntil(ctx context.Context, done <-chan error, what string, cond func() bool) error {
	deadline := time.NewTimer(connectTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case err := <-done:
			return fmt.Errorf("dev bastion: stopped waiting for %s: %w", what, errors.Join(errBastionStopped, err))
		case <-deadline.C:
			return fmt.Errorf("dev bastion: no %s within %s", what, connectTimeout)
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	return nil
}

// errBastionStopped is waitUntil's error when the bastion's Run ended.
var errBastionStopped = errors.New("the bastion stopped")

// bastionHint says which bastion dev runs and what to try with it.
func bastionHint(id, upstream, dir string) string {
	return fmt.Sprintf("Bastion %s (data in %s) forwards a fake Ollama at %s; granted inference on %s only ($BC_BASTION_ID):\n", id, dir, upstream, FakeModelPublic) +
		fmt.Sprintf("  better-compute bastions connect --bastion %s --lane inference/ollama --listen 127.0.0.1:18434 &\n", id) +
		"  curl -s http://127.0.0.1:18434/api/tags    # only " + FakeModelPublic + ": the list is rewritten to the grant\n" +
		"  curl -s http://127.0.0.1:18434/api/generate -d '{\"model\":\"" + FakeModelPublic + "\",\"prompt\":\"hi\",\"stream\":false}'\n" +
		"  curl -s http://127.0.0.1:18434/api/generate -d '{\"model\":\"" + FakeModelPrivate + "\",\"prompt\":\"hi\",\"stream\":false}'    # refused: model-out-of-scope\n"
}
