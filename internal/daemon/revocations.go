package daemon

import (
	"context"
	"errors"
	"time"

	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/revocations/revwire"
	"github.com/bettercompute/bettercompute/internal/tickets"
)

// SSHRevoker is what a driver implements to take revoked SSH certificate
// serials from the revocation feed into the node's KRL at once, ahead of
// the ssh.access state of generation that lists them
// (sshaccess.Driver.RevokeSerials).
type SSHRevoker interface {
	RevokeSerials(generation uint64, serials ...uint64) error
}

// ReasonRevocationBatchTooLarge: a Revocations message carried more than
// revwire.MaxBatch entries; none of it is read.
const ReasonRevocationBatchTooLarge = "revocation-batch-too-large"

// applyRevocations applies the feed entries a gateway relayed, each only
// once it verifies (revwire.Verifier: a worker's signature chaining to the
// pinned command-signing roots, this deployment, this node, a kind for
// nodes): an SSH certificate serial goes into the KRL the sshaccess
// driver wrote, a ticket's jti into the tunnels' spent store. A refused
// entry is logged and counted under its reason (Refusals) and changes
// nothing.
func (n *Node) applyRevocations(ctx context.Context, r *nodev1.Revocations) {
	entries := r.GetEntries()
	if len(entries) > revwire.MaxBatch {
		n.cfg.Log.Warn("revocations refused", "node_id", n.rec.NodeID, "why", ReasonRevocationBatchTooLarge, "count", len(entries))
		n.countRefusal(ReasonRevocationBatchTooLarge)
		return
	}
	v := n.revocationVerifier()
	now := n.now()
	for _, e := range entries {
		body, reason := v.VerifySigned(e, now)
		if reason != "" {
			n.cfg.Log.Warn("revocation refused", "node_id", n.rec.NodeID, "why", reason)
			n.countRefusal(string(reason))
			n.toldRevocation("", string(reason))
			continue
		}
		if err := n.applyRevocation(ctx, body); err != nil {
			n.cfg.Log.Error("apply revocation", "node_id", n.rec.NodeID, "seq", body.Seq, "kind", body.Kind, "err", err)
		}
		n.toldRevocation(body.Kind, "")
	}
}

// OnRevocation registers f, told of each revocation-feed entry the node
// takes (its kind, reason "") or refuses (kind "", the reason), after it
// acted on it (tests wait on it instead of sleeping).
func (n *Node) OnRevocation(f func(kind, reason string)) {
	n.mu.Lock()
	n.onRevocation = f
	n.mu.Unlock()
}

func (n *Node) toldRevocation(kind, reason string) {
	n.mu.Lock()
	f := n.onRevocation
	n.mu.Unlock()
	if f != nil {
		f(kind, reason)
	}
}

// revocationVerifier verifies entries against the roots pinned now.
func (n *Node) revocationVerifier() *revwire.Verifier {
	return &revwire.Verifier{Roots: n.pinned.commandRoots, TrustDomain: n.verify.TrustDomain, Deployment: n.verify.Deployment,
		NodeID: n.rec.NodeID, WorkerChains: n.verify.WorkerChains}
}

// applyRevocation applies one verified entry.
func (n *Node) applyRevocation(ctx context.Context, b *nodev1.RevocationBody) error {
	switch b.Kind {
	case revwire.KindSSHCert:
		serial, _ := revwire.SSHSerial(b.Subject) // checked by the verifier
		r, ok := n.cfg.Driver.(SSHRevoker)
		if !ok {
			return nil // no break-glass SSH on this node
		}
		return r.RevokeSerials(b.Generation, serial)
	case revwire.KindTicket:
		// A ticket lives tickets.Lifetime from its issue, which is before
		// the spend the entry records.
		err := n.tunnels.spent.Spend(ctx, b.Subject, time.UnixMilli(b.AtMs).Add(tickets.Lifetime))
		if errors.Is(err, tickets.ErrSpent) {
			return nil
		}
		return err
	}
	return nil
}
