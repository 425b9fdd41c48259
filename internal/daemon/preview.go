package daemon

import (
	"context"
	"errors"

	"google.golang.org/grpc"

	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/tickets"
)

// openPreview answers a TunnelOpen for a sandbox preview: it verifies the
// ticket (as openTunnel does, for the preview action, the sandbox and the
// port the TunnelOpen names, which the signed ticket must name too) and
// only then connects to 127.0.0.1:<port> inside that sandbox's network
// namespace (driver.SandboxDialer); the stream then carries the bytes
// both ways as a tunnel's.
func (n *Node) openPreview(ctx context.Context, conn *grpc.ClientConn, m *nodev1.TunnelOpen) {
	port, reason := n.checkPreviewTicket(ctx, m.GetTicket(), m.GetSandboxId(), m.GetPort())
	var local halfCloser
	if reason == "" {
		local, reason = n.dialSandbox(ctx, m.GetSandboxId(), port)
	}
	if local != nil {
		defer local.Close()
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, ok := n.answerTunnel(sctx, conn, m.GetTunnelId(), reason)
	if !ok {
		return
	}
	n.cfg.Log.Info("preview open", "node_id", n.rec.NodeID, "tunnel_id", m.GetTunnelId(), "sandbox_id", m.GetSandboxId(), "port", port)
	pumpTunnel(stream, local, cancel)
	n.cfg.Log.Info("preview closed", "node_id", n.rec.NodeID, "tunnel_id", m.GetTunnelId())
}

// dialSandbox connects to port inside sandboxID through the driver, or
// returns the node's reason it cannot.
func (n *Node) dialSandbox(ctx context.Context, sandboxID string, port uint32) (halfCloser, string) {
	d, ok := n.cfg.Driver.(driver.SandboxDialer)
	if !ok {
		return nil, nodev1.PreviewUnsupported
	}
	c, err := d.DialSandbox(ctx, sandboxID, uint16(port))
	switch {
	case errors.Is(err, driver.ErrPreviewSandboxGone):
		return nil, nodev1.PreviewSandboxGone
	case errors.Is(err, driver.ErrPreviewUnsupported):
		return nil, nodev1.PreviewUnsupported
	case err != nil:
		n.cfg.Log.Info("preview dial failed", "node_id", n.rec.NodeID, "sandbox_id", sandboxID, "port", port, "err", err)
		return nil, nodev1.PreviewDialFailed
	}
	hc, ok := c.(halfCloser)
	if !ok {
		_ = c.Close()
		return nil, nodev1.PreviewUnsupported
	}
	return hc, ""
}

// checkPreviewTicket verifies a preview's ticket for sandboxID and port
// and spends its jti; it returns the port, or why it is refused.
func (n *Node) checkPreviewTicket(ctx context.Context, st *nodev1.SignedTicket, sandboxID string, port uint32) (uint32, string) {
	body, r := n.redeemTicket(ctx, st, tickets.Want{NodeID: n.rec.NodeID, SandboxID: sandboxID, Port: port, Actions: []string{tickets.ActionSandboxPreview}})
	if r != "" {
		return 0, r
	}
	return body.Port, ""
}
