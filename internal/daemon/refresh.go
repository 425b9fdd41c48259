package daemon

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// RefreshInterval is how often a connected node asks its gateway for the
// trust bundle, besides once at the start of every session. A key
// rotation step takes effect in a control plane process when it restarts
// (which ends the node's session, so the next one refreshes at once); the
// interval covers gateways that stay up while another process restarts.
const RefreshInterval = 10 * time.Minute

// Refresh outcomes other than acceptance and pki's ErrBundleNotNewer and
// ErrBundleChangesPins, which RefreshBundle and OfferTrustBundle return
// wrapped as they are.
var (
	// ErrRefreshUnverified: the offered bundle carries no valid signature
	// by a join key the pinned bundle allows, or does not decode. The node
	// keeps its pinned bundle.
	ErrRefreshUnverified = errors.New("daemon: offered trust bundle is not signed by a pinned join key")
	// ErrRefreshFetch: the gateway did not answer the Bundle call (a
	// transport failure, not a refusal); the next tick tries again.
	ErrRefreshFetch = errors.New("daemon: trust bundle fetch failed")
)

// pinnedTrust is what the node pins and may refresh: its join record (the
// signed bundle and the join key that verified it) and the decoded bundle.
// The record's node id and gateway never change; Node.rec keeps them.
type pinnedTrust struct {
	mu        sync.Mutex
	rec       JoinRecord
	bundle    pki.TrustBundle
	roots     []*x509.Certificate // bundle's command roots, parsed
	onRefresh func(error)

	// refreshing holds one refresh at a time, so two cannot both pass
	// CheckRefresh against the same pinned bundle and race their writes.
	refreshing sync.Mutex
}

func newPinnedTrust(rec JoinRecord, tb pki.TrustBundle, roots []*x509.Certificate) *pinnedTrust {
	return &pinnedTrust{rec: rec, bundle: tb, roots: roots}
}

// commandRoots returns the pinned command roots (Verifier.CurrentRoots).
func (p *pinnedTrust) commandRoots() []*x509.Certificate {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.roots
}

// get returns the pinned record and bundle.
func (p *pinnedTrust) get() (JoinRecord, pki.TrustBundle) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rec, p.bundle
}

// trustBundle returns the pinned trust bundle in force.
func (n *Node) trustBundle() pki.TrustBundle {
	_, tb := n.pinned.get()
	return tb
}

// OnRefresh registers f to be told the outcome of every trust-bundle
// refresh the session makes (nil: accepted); tests wait on it instead of
// sleeping.
func (n *Node) OnRefresh(f func(error)) {
	n.pinned.mu.Lock()
	n.pinned.onRefresh = f
	n.pinned.mu.Unlock()
}

// startRefresh runs refreshLoop over the session's connection until ctx
// ends or the returned stop is called; stop waits for it, so no refresh
// writes the join record after the session is over.
func (n *Node) startRefresh(ctx context.Context, conn grpc.ClientConnInterface) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.refreshLoop(ctx, conn)
	}()
	return func() {
		cancel()
		<-done
	}
}

// refreshLoop refreshes the trust bundle over conn now, then every
// RefreshInterval by the node's clock, until ctx (the session) ends.
func (n *Node) refreshLoop(ctx context.Context, conn grpc.ClientConnInterface) {
	t := n.cfg.Clock.NewTicker(RefreshInterval)
	defer t.Stop()
	for {
		n.refreshOnce(ctx, conn)
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
	}
}

// refreshOnce runs one refresh and logs its outcome: a refusal is a
// warning (the pinned bundle stays), an unchanged bundle only a debug line.
func (n *Node) refreshOnce(ctx context.Context, conn grpc.ClientConnInterface) {
	err := n.RefreshBundle(ctx, conn)
	switch {
	case ctx.Err() != nil:
		return // the session ended during the call
	case err == nil:
		n.cfg.Log.Info("trust bundle refreshed", "node_id", n.rec.NodeID, "issued_at", n.trustBundle().IssuedAt)
	case errors.Is(err, pki.ErrBundleNotNewer):
		n.cfg.Log.Debug("trust bundle unchanged", "node_id", n.rec.NodeID)
	case errors.Is(err, ErrRefreshFetch):
		n.cfg.Log.Info("trust bundle fetch failed", "node_id", n.rec.NodeID, "err", err)
	default:
		n.cfg.Log.Warn("offered trust bundle refused, keeping the pinned one", "node_id", n.rec.NodeID, "err", err)
	}
	n.pinned.mu.Lock()
	f := n.pinned.onRefresh
	n.pinned.mu.Unlock()
	if f != nil {
		f(err)
	}
}

// RefreshBundle asks the gateway over conn (the session's connection,
// whose gateway certificate verified under the pinned server roots) for
// its signed trust bundle and offers it to OfferTrustBundle.
func (n *Node) RefreshBundle(ctx context.Context, conn grpc.ClientConnInterface) error {
	sb, err := nodev1.NewGatewayClient(conn).Bundle(ctx, &nodev1.BundleRequest{})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrRefreshFetch, err)
	}
	return n.OfferTrustBundle(sb)
}

// OfferTrustBundle adopts sb when a join key the pinned bundle allows
// (pki.TrustBundle.Pins) signed it and pki.CheckRefresh accepts it over
// the pinned one: strictly newer, same trust domain, deployment and
// approvers. It then writes the join record (atomically, 0600), and the
// new command roots verify commands at once; the new server and node
// roots serve the next dial and renewal. On any refusal nothing changes:
// ErrRefreshUnverified, or pki.ErrBundleNotNewer / ErrBundleChangesPins.
func (n *Node) OfferTrustBundle(sb *nodev1.SignedTrustBundle) error {
	p := n.pinned
	p.refreshing.Lock()
	defer p.refreshing.Unlock()
	rec, cur := p.get()
	next, used, err := pki.VerifyTrustBundleAny(sb.GetBody(), offeredSignatures(sb), cur.Pins(ed25519.PublicKey(rec.JoinPublicKey)))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrRefreshUnverified, err)
	}
	if err := pki.CheckRefresh(cur, next); err != nil {
		return err
	}
	roots, err := next.CommandRootCerts()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrRefreshUnverified, err)
	}
	pin := pki.JoinKeyPin(used.Key)
	rec.Pin, rec.JoinPublicKey = pin[:], bytes.Clone(used.Key)
	rec.BundleBody, rec.BundleSig = bytes.Clone(sb.GetBody()), bytes.Clone(used.Sig)
	if err := writeJSON(n.cfg.DataDir, joinFile, rec); err != nil {
		return err
	}
	p.mu.Lock()
	p.rec, p.bundle, p.roots = rec, next, roots
	p.mu.Unlock()
	return nil
}

// offeredSignatures lists sb's signatures: the active join key's first,
// then the others.
func offeredSignatures(sb *nodev1.SignedTrustBundle) []pki.JoinSignature {
	sigs := []pki.JoinSignature{{Key: sb.GetJoinPublicKey(), Sig: sb.GetSignature()}}
	for _, o := range sb.GetOtherSignatures() {
		sigs = append(sigs, pki.JoinSignature{Key: o.GetJoinPublicKey(), Sig: o.GetSignature()})
	}
	return sigs
}
