package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sync"
	"time"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/tickets"
)

// TunnelOpenTimeout is how long OpenTunnel waits for the node to answer a
// TunnelOpen with its Tunnel stream.
const TunnelOpenTimeout = 10 * time.Second

// nodeReasonRE is the shape of a node's refusal reason (nodev1.Tunnel*
// or a ticket's reason) the gateway relays to the client; anything else
// is relayed as "refused".
var nodeReasonRE = regexp.MustCompile(`^[a-z0-9-]{1,64}$`)

// pendingTunnel is a TunnelOpen sent and not yet answered.
type pendingTunnel struct {
	nodeID string
	ch     chan tunnelAnswer // buffered 1: the node's answer
}

// tunnelAnswer is the node's answer to a TunnelOpen: its stream, or why it
// refused.
type tunnelAnswer struct {
	stream  *NodeStream
	refused string
}

// NodeStream is one tunnel's stream to a node: what Recv returns the node
// read from 127.0.0.1:<port>, what Send sends the node writes there. It
// ends when the node's session ends on this gateway, when either side
// closes it, or when the node's Tunnel call ends.
type NodeStream struct {
	stream nodev1.Gateway_TunnelServer
	// ctx ends with the tunnel: the node's Tunnel call, its session, or
	// Close.
	ctx    context.Context
	cancel context.CancelFunc

	sendMu sync.Mutex
	closed bool
}

// Recv returns the next bytes from the node. eof is true once the node
// sent no more (its side of the port closed for writing); exit is an
// exec's exit status, after which the node sends nothing; err is the
// reason the tunnel ended otherwise.
func (t *NodeStream) Recv() (data []byte, eof bool, exit *int32, err error) {
	f, err := t.stream.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, false, nil, io.ErrUnexpectedEOF
		}
		if t.ctx.Err() != nil {
			return nil, false, nil, errNodeGone
		}
		return nil, false, nil, err
	}
	switch x := f.Frame.(type) {
	case *nodev1.TunnelFrame_Data:
		if len(x.Data) > nodev1.MaxTunnelData {
			return nil, false, nil, errors.New("gateway: tunnel frame over its bound")
		}
		return x.Data, false, nil, nil
	case *nodev1.TunnelFrame_Eof:
		return nil, true, nil, nil
	case *nodev1.TunnelFrame_ExitCode:
		code := x.ExitCode
		return nil, false, &code, nil
	case *nodev1.TunnelFrame_Error:
		return nil, false, nil, errs.New(errs.Unavailable, "the node ended the tunnel")
	}
	return nil, false, nil, errors.New("gateway: unexpected tunnel frame")
}

// Resize sends a terminal's new size to the node (an exec's PTY).
func (t *NodeStream) Resize(cols, rows uint16) error {
	return t.send(&nodev1.TunnelFrame{Frame: &nodev1.TunnelFrame_Resize{Resize: &nodev1.TunnelResize{Cols: uint32(cols), Rows: uint32(rows)}}})
}

// errNodeGone: the node's session or Tunnel call ended under the tunnel.
var errNodeGone = errs.New(errs.Unavailable, "the node disconnected")

// Send sends data to the node, in frames of at most MaxTunnelData.
func (t *NodeStream) Send(data []byte) error {
	for len(data) > 0 {
		n := min(len(data), nodev1.MaxTunnelData)
		if err := t.send(&nodev1.TunnelFrame{Frame: &nodev1.TunnelFrame_Data{Data: data[:n]}}); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

// CloseSend tells the node the client sends no more (a half-close).
func (t *NodeStream) CloseSend() error {
	return t.send(&nodev1.TunnelFrame{Frame: &nodev1.TunnelFrame_Eof{Eof: true}})
}

func (t *NodeStream) send(f *nodev1.TunnelFrame) error {
	t.sendMu.Lock()
	defer t.sendMu.Unlock()
	if t.closed || t.ctx.Err() != nil {
		return errNodeGone
	}
	return t.stream.Send(f)
}

// Close ends the tunnel, telling the node why (a short reason such as
// "closed" or "access-revoked"). It is safe to call more than once.
func (t *NodeStream) Close(reason string) {
	t.sendMu.Lock()
	if !t.closed && t.ctx.Err() == nil {
		_ = t.stream.Send(&nodev1.TunnelFrame{Frame: &nodev1.TunnelFrame_Error{Error: reason}})
	}
	t.closed = true
	t.sendMu.Unlock()
	t.cancel()
}

// Done is closed when the tunnel ended.
func (t *NodeStream) Done() <-chan struct{} { return t.ctx.Done() }

// TunnelTarget is what a tunnel goes to: a port on a node's loopback, or
// a program in a sandbox on a node (SandboxID set, Port 0), by Action.
type TunnelTarget struct {
	NodeID    string
	Port      uint32
	SandboxID string
	Action    string
}

// OpenTunnel opens a tunnel to to for a client holding ticket, through
// the node's session on this gateway. It verifies the ticket again
// (signed by a worker, for this node, port or sandbox and action, fresh)
// and spends its jti before it asks the node, which verifies it once more
// with its own spent store. It fails with a coded error: the ticket's
// reason (tickets.Reason.Err), INVALID_STATE when the node has no session
// on this gateway, UNAVAILABLE when the node does not answer in
// TunnelOpenTimeout or nothing listens on the port, ACCESS_DENIED with
// the node's reason when the node refused.
func (g *Gateway) OpenTunnel(ctx context.Context, to TunnelTarget, ticket *nodev1.SignedTicket) (*NodeStream, error) {
	nodeID, port := to.NodeID, to.Port
	if g.cfg.Tickets == nil || g.cfg.Spent == nil {
		return nil, errs.New(errs.Unavailable, "tunnels are not configured on this gateway")
	}
	s := g.liveSession(ctx, nodeID)
	if s == nil {
		return nil, errs.New(errs.InvalidState, "the node has no session on this gateway")
	}
	body, reason := g.cfg.Tickets.RedeemSigned(ctx, ticket, g.cfg.Clock.Now(), tickets.Want{NodeID: nodeID, Port: port, SandboxID: to.SandboxID, Actions: []string{to.Action}}, g.cfg.Spent)
	if reason != "" {
		g.cfg.Log.Info("tunnel refused", "node_id", nodeID, "port", port, "reason", reason)
		return nil, reason.Err()
	}
	p := &pendingTunnel{nodeID: nodeID, ch: make(chan tunnelAnswer, 1)}
	id := ids.New("tun")
	g.mu.Lock()
	g.tunnels[id] = p
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		delete(g.tunnels, id)
		g.mu.Unlock()
	}()
	if err := s.send(&nodev1.ServerMessage{Msg: &nodev1.ServerMessage_TunnelOpen{TunnelOpen: &nodev1.TunnelOpen{TunnelId: id, Ticket: ticket, SandboxId: to.SandboxID, Port: sandboxPort(to)}}}); err != nil {
		return nil, errNodeGone
	}
	timer := g.cfg.Clock.NewTimer(TunnelOpenTimeout)
	defer timer.Stop()
	select {
	case a := <-p.ch:
		if a.refused != "" {
			g.cfg.Log.Info("tunnel refused by node", "node_id", nodeID, "port", port, "tunnel_id", id, "reason", a.refused)
			return nil, nodeRefusal(a.refused, port)
		}
		g.cfg.Log.Info("tunnel open", "node_id", nodeID, "port", port, "tunnel_id", id, "jti", body.Jti)
		return a.stream, nil
	case <-timer.C():
		return nil, errs.New(errs.Unavailable, "the node did not answer the tunnel")
	case <-s.ctx.Done():
		return nil, errNodeGone
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// sandboxPort is the port hint of a TunnelOpen: a preview's port (the
// node checks it against the signed ticket), zero for every other tunnel.
func sandboxPort(to TunnelTarget) uint32 {
	if to.Action == tickets.ActionSandboxPreview {
		return to.Port
	}
	return 0
}

// nodeRefusal is the client's error for the node's refusal reason.
func nodeRefusal(reason string, port uint32) error {
	switch reason {
	case nodev1.TunnelPortNotAllowed:
		return errs.New(errs.AccessDenied, fmt.Sprintf("the node refused the tunnel: port %d is not on its tunnel allow list (%s)", port, reason))
	case nodev1.TunnelDialFailed:
		return errs.New(errs.Unavailable, fmt.Sprintf("the node refused the tunnel: nothing answers on its port %d (%s)", port, reason))
	case nodev1.ExecSandboxGone:
		return errs.New(errs.InvalidState, "the node refused the exec: the sandbox is not running there ("+reason+")")
	case nodev1.PreviewSandboxGone:
		return errs.New(errs.InvalidState, "the node refused the preview: the sandbox is not running there ("+reason+")")
	case nodev1.PreviewDialFailed:
		return errs.New(errs.Unavailable, fmt.Sprintf("the node refused the preview: nothing answers on port %d in the sandbox (%s)", port, reason))
	case nodev1.ExecFailed:
		return errs.New(errs.Unavailable, "the node could not start the program ("+reason+")")
	}
	return errs.New(errs.AccessDenied, "the node refused the tunnel: "+reason)
}

// liveSession returns nodeID's session on this gateway once it is
// welcomed, or nil when it has none. A session still opening (its node
// may already hold the Welcome while the gateway sends its desired state)
// is waited for, up to TunnelOpenTimeout: a node that reads as connected
// is not refused for a moment of its own handshake.
func (g *Gateway) liveSession(ctx context.Context, nodeID string) *session {
	g.mu.Lock()
	s := g.sessions[nodeID]
	g.mu.Unlock()
	if s == nil {
		return nil
	}
	timer := g.cfg.Clock.NewTimer(TunnelOpenTimeout)
	defer timer.Stop()
	select {
	case <-s.ready:
		return s
	case <-s.ctx.Done():
	case <-ctx.Done():
	case <-timer.C():
	}
	return nil
}

// Tunnel serves a node's Tunnel stream: its first frame names a tunnel
// this gateway asked that node (and no other) to open; the stream then
// carries the tunnel until either side ends it or the node's session on
// this gateway ends. The interceptors authenticated the node.
func (g *Gateway) Tunnel(stream nodev1.Gateway_TunnelServer) error {
	ctx := stream.Context()
	c, err := mustCaller(ctx, nodev1.Gateway_Tunnel_FullMethodName)
	if err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	g.mu.Lock()
	var p *pendingTunnel
	if hello != nil {
		p = g.tunnels[hello.TunnelId]
		if p != nil && p.nodeID == c.id.NodeID {
			delete(g.tunnels, hello.TunnelId)
		} else {
			p = nil
		}
	}
	s := g.sessions[c.id.NodeID]
	g.mu.Unlock()
	if p == nil || s == nil {
		g.cfg.Log.Info("tunnel stream refused", "node_id", c.id.NodeID, "why", "no tunnel of this node's with that id")
		return errAccessDenied
	}
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel) // the session ended
	defer stop()
	if r := refusalOf(hello); r != "" {
		p.ch <- tunnelAnswer{refused: r}
		return nil
	}
	t := &NodeStream{stream: stream, ctx: tctx, cancel: cancel}
	p.ch <- tunnelAnswer{stream: t}
	<-tctx.Done()
	return nil
}

// refusalOf returns the node's reason when its hello refused the tunnel
// ("refused" for a reason not of the expected shape), else "".
func refusalOf(hello *nodev1.TunnelHello) string {
	r := hello.GetRefused()
	if r == "" {
		return ""
	}
	if !nodeReasonRE.MatchString(r) {
		return "refused"
	}
	return r
}
