package gateway

import (
	"context"
	"time"

	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/revocations/revwire"
)

// RevocationFeed is the revocation feed as a gateway follows it
// (revocations.Feed).
type RevocationFeed interface {
	// Head is the last sequence number committed.
	Head(ctx context.Context) (int64, error)
	// SignedSince returns the entries after seq after, in order, at most
	// limit, stopping before the first one not signed yet.
	SignedSince(ctx context.Context, after int64, limit int) ([]revwire.Entry, error)
	// ForNode returns the newest limit signed entries naming nodeID at or
	// after since, in feed order.
	ForNode(ctx context.Context, nodeID string, since time.Time, limit int) ([]revwire.Entry, error)
}

// feedRound is how many entries one read of the feed takes.
const feedRound = 500

// followFeed follows the revocation feed from its head until ctx ends:
// woken by every signed batch (this process's workers or, through
// PostgreSQL NOTIFY, another's) and at least every RevocationPoll, it
// reads `seq > last`, closes the sessions of the node certificates an
// entry revokes, and relays each entry a node should apply (revwire.ForNode:
// its SSH certificate serials, its spent tickets) to that node's session
// here. It never passes an entry that is not signed yet, so no entry is
// skipped: the next read starts at it.
func (g *Gateway) followFeed(ctx context.Context) {
	f := g.cfg.Feed
	if f == nil {
		return
	}
	local, stop := g.poke.Subscribe(bus.TopicRevocationsSigned)
	defer stop()
	remote, stopRemote := g.poke.Subscribe(bus.RemoteTopic(bus.TopicRevocationsSigned))
	defer stopRemote()
	t := time.NewTicker(g.cfg.RevocationPoll)
	defer t.Stop()
	last := int64(-1) // the head is read on the first round
	for {
		if last < 0 {
			head, err := f.Head(ctx)
			if err != nil && ctx.Err() == nil {
				g.cfg.Log.Error("read revocation feed head", "err", err)
			} else if err == nil {
				last = head
			}
		} else {
			last = g.followRound(ctx, f, last)
		}
		select {
		case <-ctx.Done():
			return
		case <-local:
		case <-remote:
		case <-t.C:
		}
	}
}

// followRound applies the signed entries after last and returns the last
// one applied.
func (g *Gateway) followRound(ctx context.Context, f RevocationFeed, last int64) int64 {
	for {
		batch, err := f.SignedSince(ctx, last, feedRound)
		if err != nil {
			if ctx.Err() == nil {
				g.cfg.Log.Error("read revocation feed", "err", err)
			}
			return last
		}
		if len(batch) == 0 {
			return last
		}
		g.applyFeed(ctx, batch)
		last = batch[len(batch)-1].Seq
		if len(batch) < feedRound {
			return last
		}
	}
}

// applyFeed closes the sessions of revoked node certificates and relays
// the entries for nodes to their sessions on this gateway, in feed order.
func (g *Gateway) applyFeed(ctx context.Context, batch []revwire.Entry) {
	relay := map[string][]*nodev1.SignedRevocation{}
	var closing []*session
	g.mu.Lock()
	for _, e := range batch {
		s := g.sessions[e.NodeID]
		switch {
		case s == nil:
		case e.Kind == revwire.KindNodeCert && s.serial == e.Subject:
			closing = append(closing, s)
		case revwire.ForNode(e.Kind) && e.Signed != nil:
			relay[e.NodeID] = append(relay[e.NodeID], e.Signed)
		}
	}
	sends := map[string]sender{}
	for nodeID := range relay {
		if s := g.sessions[nodeID]; s != nil && s.send != nil {
			sends[nodeID] = s.send
		}
	}
	g.mu.Unlock()
	for _, s := range closing {
		s.cancel(g.revocationCause(ctx, s.serial))
	}
	for nodeID, send := range sends {
		// A session whose Welcome is not out yet gets these in its
		// window (sendRevocationWindow reads after it can send).
		if err := send(revocationsMessage(relay[nodeID])); err != nil {
			g.cfg.Log.Info("relay revocations", "node_id", nodeID, "err", err)
		}
	}
}

// sendRevocationWindow sends a node whose session just opened the signed
// entries naming it of the last revwire.NodeWindow. It runs once the
// session can send (s.send is set), so that an entry the follower reads
// from then on is relayed by it, and one committed before is in this
// read: none falls between.
func (g *Gateway) sendRevocationWindow(ctx context.Context, s *session, send sender) {
	f := g.cfg.Feed
	if f == nil {
		return
	}
	entries, err := f.ForNode(ctx, s.nodeID, g.cfg.Clock.Now().Add(-revwire.NodeWindow), revwire.NodeWindowMax)
	if err != nil {
		g.cfg.Log.Error("read node's revocations", "node_id", s.nodeID, "err", err)
		return
	}
	var signed []*nodev1.SignedRevocation
	for _, e := range entries {
		if revwire.ForNode(e.Kind) && e.Signed != nil {
			signed = append(signed, e.Signed)
		}
	}
	if len(signed) == 0 {
		return
	}
	if err := send(revocationsMessage(signed)); err != nil {
		g.cfg.Log.Info("send revocation window", "node_id", s.nodeID, "err", err)
	}
}

func revocationsMessage(entries []*nodev1.SignedRevocation) *nodev1.ServerMessage {
	return &nodev1.ServerMessage{Msg: &nodev1.ServerMessage_Revocations{Revocations: &nodev1.Revocations{Entries: entries}}}
}
