package server

import (
	"context"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/revocations"
	"github.com/bettercompute/bettercompute/internal/revocations/revwire"
	"github.com/bettercompute/bettercompute/internal/tunnels"
)

// errCredentialRevoked is why a tunnel the revocation feed closes ends,
// as the client's error frame says it.
var errCredentialRevoked = errs.New(errs.AccessDenied, "the caller's credential or identity was revoked; the tunnel is closed")

// wireRevocations makes the revocation feed and has the modules that
// revoke poke its signer and followers after each revocation commits.
func (cp *ControlPlane) wireRevocations(o Options) {
	cp.Revocations = revocations.New(o.DB, o.Clock, cp.Bus, o.Log)
	poke := func() { cp.Bus.Publish(bus.TopicRevoked) }
	cp.APIKeys.OnRevoked(poke)
	if cp.BreakGlass != nil {
		cp.BreakGlass.OnRevoked(poke)
	}
}

// startRevocationSigner has the workers sign the feed's entries.
func (cp *ControlPlane) startRevocationSigner(o Options) {
	b := o.Bundle
	cp.runLoop(func(ctx context.Context) {
		cp.Revocations.RunSigner(ctx, cp.Signer, b.Deployment, b.TrustDomain, signInterval)
	})
}

// followRevocations has the api process follow the feed and close the
// tunnels it serves whose caller's key, session or identity an entry
// revokes, at once rather than at their next re-decision.
func (cp *ControlPlane) followRevocations(o Options) {
	poll := o.RevocationPoll
	if poll == 0 {
		poll = time.Second
	}
	cp.runLoop(func(ctx context.Context) {
		err := cp.Revocations.Follow(ctx, poll, func(batch []revwire.Entry) {
			if n := closeRevokedTunnels(cp.Tunnels, batch); n > 0 {
				o.Log.Info("tunnels closed by revocation", "count", n)
			}
		})
		logErr(ctx, o.Log, "follow revocations", err)
	})
}

// closeRevokedTunnels closes the tunnels of t whose caller presented a
// credential, or is an identity, that batch revokes.
func closeRevokedTunnels(t *tunnels.Service, batch []revwire.Entry) int {
	creds, identities := map[string]bool{}, map[string]bool{}
	for _, e := range batch {
		switch e.Kind {
		case revwire.KindAPIKey, revwire.KindSession:
			creds[e.Subject] = true
		case revwire.KindIdentity:
			identities[e.Subject] = true
		}
	}
	if t == nil || len(creds)+len(identities) == 0 {
		return 0
	}
	return t.CloseFor(func(a audit.Entry) bool {
		return a.Credential != "" && creds[a.Credential] || identities[a.Actor]
	}, errCredentialRevoked)
}
