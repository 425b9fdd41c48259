package gateway

import (
	"context"

	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// DesiredStates gives a node's signed desired state (issue 17): its
// certificate's role and allowed kinds under the node's host generation,
// signed by a worker key. The gateway relays it verbatim; it cannot make
// one (it holds no signing key), and the node and its root helper verify
// it under their own pinned roots.
type DesiredStates interface {
	// DesiredState signs the desired state of the node whose session
	// certificate is serial; nil (and no error) when there is none to
	// send.
	DesiredState(ctx context.Context, nodeID, serial string) (*nodev1.SignedDesiredState, error)
}

// sendDesiredState sends the node's signed desired state right after the
// Welcome. One that cannot be signed now (no worker key yet, a database
// error) is logged and not sent: the node keeps the one it holds, and the
// next session tries again. Only a failed send ends the session.
func (g *Gateway) sendDesiredState(ctx context.Context, s *session, send sender) error {
	if g.cfg.DesiredStates == nil {
		return nil
	}
	sd, err := g.cfg.DesiredStates.DesiredState(ctx, s.nodeID, s.serial)
	if err != nil {
		g.cfg.Log.Error("sign desired state", "node_id", s.nodeID, "err", err)
		return nil
	}
	if sd == nil {
		return nil
	}
	return send(&nodev1.ServerMessage{Msg: &nodev1.ServerMessage_DesiredState{DesiredState: sd}})
}
