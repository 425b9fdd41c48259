package gateway

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// session is one node's live stream on this gateway.
type session struct {
	id     string
	nodeID string
	serial string
	// peer is the remote address of the session's connection: a secret
	// request is answered only on it (Gateway.Secret).
	peer   string
	ctx    context.Context // ends with the session
	cancel context.CancelCauseFunc
	out    *outbox // what the dispatcher handed this session
	// send sends on the session; nil until the Welcome and the desired
	// state went out (set under Gateway.mu), so nothing else is sent
	// before them.
	send sender
	// ready is closed when send is set: a tunnel asked for while the
	// session opens waits for it instead of failing.
	ready chan struct{}
}

var (
	errRevoked = errors.New("certificate revoked")
	// errCertSuperseded closes the session of a certificate a renewal
	// replaced: not a revocation the node must stop on.
	errCertSuperseded = errors.New("certificate superseded")
	errSuperseded     = errors.New("session superseded")
	errExpired        = errors.New("certificate expired")
)

// sender sends on a stream from several goroutines, one message at a time.
type sender func(*nodev1.ServerMessage) error

func lockedSend(stream nodev1.Gateway_SessionServer) sender {
	var mu sync.Mutex
	return func(m *nodev1.ServerMessage) error {
		mu.Lock()
		defer mu.Unlock()
		return stream.Send(m)
	}
}

// Session holds a node's stream: Hello, Welcome, then commands out and
// updates in, until the node leaves, a newer boot supersedes it, or its
// certificate is revoked. The interceptors authenticated the caller.
func (g *Gateway) Session(stream nodev1.Gateway_SessionServer) error {
	ctx := stream.Context()
	c, err := mustCaller(ctx, nodev1.Gateway_Session_FullMethodName)
	if err != nil {
		return err
	}
	id := c.id
	hello, inv, err := g.readHello(stream, id.NodeID)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	s := &session{id: ids.New("s"), nodeID: id.NodeID, serial: id.Serial, peer: peerAddr(ctx), ctx: sctx, cancel: cancel, out: newOutbox(), ready: make(chan struct{})}
	bootTag := BootTag(hello.BootId)
	if err := g.open(ctx, s, c.ci, HelloInfo{NodeID: id.NodeID, BootID: bootTag, Serial: id.Serial, SessionID: s.id,
		GatewayID: g.cfg.GatewayID, Version: hello.Version, Labels: hello.Labels, Inventory: inv}); err != nil {
		return err
	}
	g.attach(s)
	defer g.detach(ctx, s)
	if err := g.requeueSuperseded(ctx, s); err != nil {
		return err
	}

	send := lockedSend(stream)
	// Subscribed before the Welcome (which carries the approver sets), so
	// a change made while the session opens is never missed.
	approverPoke, stopApproverPoke := g.poke.Subscribe(bus.TopicApprovers)
	defer stopApproverPoke()
	if err := g.welcome(ctx, s, c.ci, send); err != nil {
		return err
	}
	if err := g.sendDesiredState(ctx, s, send); err != nil {
		return err
	}
	g.mu.Lock()
	s.send = send
	g.mu.Unlock()
	close(s.ready)
	g.sendRevocationWindow(ctx, s, send)
	g.cfg.Log.Info("session open", "node_id", id.NodeID, "session_id", s.id, "boot_id", bootTag)

	// A session lives no longer than its certificate: the node renews
	// before expiry and reconnects with the new one.
	expiry := time.AfterFunc(id.NotAfter.Sub(g.cfg.Clock.Now()), func() { cancel(errExpired) })
	defer expiry.Stop()
	recvErr := make(chan error, 1)
	g.sessionLoops.Go(func() { recvErr <- g.receive(sctx, stream, id.NodeID, id.Serial, send) })
	g.sessionLoops.Go(func() { g.deliver(sctx, s, send, approverPoke) })

	select {
	case err := <-recvErr:
		cancel(err)
		return nil
	case <-sctx.Done():
		cause := context.Cause(sctx)
		g.cfg.Log.Info("session closed", "node_id", id.NodeID, "session_id", s.id, "why", cause)
		return sessionStatus(cause)
	}
}

// sessionStatus is the status a session closed for cause ends with: a
// revoked certificate's tells bcd to stop (errCertRevoked); an expired or
// superseded certificate's is UNAUTHENTICATED (the node renews or
// reconnects); anything else an aborted session.
func sessionStatus(cause error) error {
	switch {
	case errors.Is(cause, errRevoked):
		return errCertRevoked
	case errors.Is(cause, errExpired), errors.Is(cause, errCertSuperseded):
		return errUnauthenticated
	}
	return status.Error(codes.Aborted, "session closed")
}

// readHello reads the stream's first message, which must be a Hello of
// the authenticated node, and renders its inventory.
func (g *Gateway) readHello(stream nodev1.Gateway_SessionServer, nodeID string) (*nodev1.Hello, []byte, error) {
	first, err := stream.Recv()
	if err != nil {
		return nil, nil, err
	}
	hello := first.GetHello()
	if hello == nil || hello.NodeId != nodeID || hello.BootId == "" || len(hello.BootId) > 64 {
		g.cfg.Log.Info("node refused", "node_id", nodeID, "why", "first message is not a Hello for this node")
		return nil, nil, status.Error(codes.PermissionDenied, string(errs.AccessDenied))
	}
	inv, err := inventoryJSON(hello.Inventory)
	if err != nil {
		return nil, nil, status.Error(codes.InvalidArgument, string(errs.InvalidInput))
	}
	return hello, inv, nil
}

// open records the session in the registry, refuses a quarantined node,
// and cancels the node's queued commands of kinds its certificate does not
// allow, before the session can be handed any.
func (g *Gateway) open(ctx context.Context, s *session, ci CertInfo, h HelloInfo) error {
	res, err := g.reg.OpenSession(ctx, h)
	if err != nil {
		g.cfg.Log.Error("open session", "node_id", s.nodeID, "err", err)
		return status.Error(codes.Internal, string(errs.Internal))
	}
	if res.Quarantined {
		g.cfg.Log.Warn("node quarantined", "node_id", s.nodeID, "serial", s.serial)
		g.dropSessions(s.nodeID, errRevoked)
		return errCertRevoked
	}
	if n, err := g.cmds.CancelDisallowed(ctx, s.nodeID, ci.Role, ci.AllowedKinds); err != nil {
		g.cfg.Log.Error("cancel disallowed kinds", "node_id", s.nodeID, "err", err)
		return status.Error(codes.Internal, string(errs.Internal))
	} else if n > 0 {
		g.cfg.Log.Info("cancelled commands not allowed for certificate", "node_id", s.nodeID, "count", n)
	}
	return nil
}

// attach makes s its node's session on this gateway, superseding the
// previous one, and gives the dispatcher its outbox.
func (g *Gateway) attach(s *session) {
	g.mu.Lock()
	if old := g.sessions[s.nodeID]; old != nil {
		old.cancel(errSuperseded)
	}
	g.sessions[s.nodeID] = s
	g.disp.attach(s.nodeID, s.out)
	g.mu.Unlock()
}

// detach ends s: what was handed to it and not sent goes back to the
// queue, and the registry marks it closed.
func (g *Gateway) detach(ctx context.Context, s *session) {
	g.mu.Lock()
	if g.sessions[s.nodeID] == s {
		delete(g.sessions, s.nodeID)
	}
	g.disp.detach(s.nodeID, s.out)
	g.mu.Unlock()
	if err := g.reg.CloseSession(context.WithoutCancel(ctx), s.nodeID, s.id); err != nil {
		g.cfg.Log.Error("close session", "node_id", s.nodeID, "err", err)
	}
}

// requeueSuperseded puts the node's commands still sent on its earlier
// sessions back in the queue, for s to deliver. This Hello superseded
// them all in the registry, and on this gateway s replaced them in the
// dispatcher before this runs; it catches what no session end requeued:
// a session whose gateway died (killed after marking a command sent, its
// heartbeat going stale) or that was recorded on another gateway after
// that gateway's requeue.
func (g *Gateway) requeueSuperseded(ctx context.Context, s *session) error {
	n, err := g.cmds.RequeueNode(ctx, s.nodeID, s.id)
	if err != nil {
		g.cfg.Log.Error("requeue commands of earlier sessions", "node_id", s.nodeID, "err", err)
		return status.Error(codes.Internal, string(errs.Internal))
	}
	if n > 0 {
		g.cfg.Log.Info("requeued commands of earlier sessions", "node_id", s.nodeID, "session_id", s.id, "count", n)
	}
	return nil
}

// welcome sends the Welcome: the session id, the certificate's allowed
// kinds, the approver-set chain and the latest time statement.
func (g *Gateway) welcome(ctx context.Context, s *session, ci CertInfo, send sender) error {
	sets, err := g.svc.ApproverSets(ctx)
	if err != nil {
		g.cfg.Log.Error("read approver sets", "node_id", s.nodeID, "err", err)
		return status.Error(codes.Internal, string(errs.Internal))
	}
	// A statement that cannot be read leaves the node on its own clock.
	st, err := g.svc.TimeStatement(ctx)
	if err != nil {
		g.cfg.Log.Error("read time statement", "node_id", s.nodeID, "err", err)
		st = nil
	}
	return send(&nodev1.ServerMessage{Msg: &nodev1.ServerMessage_Welcome{Welcome: &nodev1.Welcome{
		ServerTimeMs: g.cfg.Clock.Now().UnixMilli(), SessionId: s.id, AllowedKinds: ci.AllowedKinds, ApproverSets: sets, Time: st}}})
}

// dropSessions cancels the node's live session on this gateway.
func (g *Gateway) dropSessions(nodeID string, cause error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if s := g.sessions[nodeID]; s != nil {
		s.cancel(cause)
	}
}

// receive handles what the node sends until the stream ends: updates
// (batched with every session's), sandbox reports and pings.
func (g *Gateway) receive(ctx context.Context, stream nodev1.Gateway_SessionServer, nodeID, serial string, send sender) error {
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		var reply *nodev1.ServerMessage
		switch msg := m.Msg.(type) {
		case *nodev1.NodeMessage_Update:
			r, err := g.applyUpdate(ctx, wire.UpdateItem{NodeID: nodeID, Update: msg.Update})
			if err != nil {
				return err
			}
			reply = &nodev1.ServerMessage{Msg: &nodev1.ServerMessage_Ack{Ack: updateAck(r)}}
			if r.Err != nil {
				g.cfg.Log.Warn("update refused", "node_id", nodeID, "err", r.Err)
			}
		case *nodev1.NodeMessage_SandboxReport:
			// Relayed as is: the sandboxes module checks the signature and
			// that the sandbox is this node's.
			id, err := g.svc.SandboxReport(ctx, nodeID, serial, msg.SandboxReport)
			if err != nil {
				g.cfg.Log.Warn("sandbox report refused", "node_id", nodeID, "err", err)
				continue
			}
			sum := sha256.Sum256(msg.SandboxReport.GetBody())
			reply = &nodev1.ServerMessage{Msg: &nodev1.ServerMessage_SandboxAck{SandboxAck: &nodev1.SandboxReportAck{SandboxId: id, BodySha256: sum[:]}}}
		case *nodev1.NodeMessage_HelperEvents:
			if err := g.svc.HelperEvents(ctx, nodeID, msg.HelperEvents); err != nil {
				g.cfg.Log.Warn("helper events refused", "node_id", nodeID, "err", err)
				continue
			}
			reply = &nodev1.ServerMessage{Msg: &nodev1.ServerMessage_HelperEventsAck{HelperEventsAck: &nodev1.HelperEventsAck{Seq: msg.HelperEvents.GetSeq()}}}
		case *nodev1.NodeMessage_Ping:
			reply = &nodev1.ServerMessage{Msg: &nodev1.ServerMessage_Ping{Ping: &nodev1.Ping{TimeMs: g.cfg.Clock.Now().UnixMilli()}}}
		default:
			return fmt.Errorf("gateway: unexpected message %T", m.Msg)
		}
		if err := send(reply); err != nil {
			return err
		}
	}
}

// sendApproverSets sends the approver-set chain again after it changed
// (poked on the bus; other processes' changes reach a node at its next
// session). It reports false only when the stream is broken; a failed read
// is logged and the chain goes out at the next change or session.
func (g *Gateway) sendApproverSets(ctx context.Context, nodeID string, send sender) bool {
	sets, err := g.svc.ApproverSets(ctx)
	if err != nil {
		if ctx.Err() == nil {
			g.cfg.Log.Error("read approver sets", "node_id", nodeID, "err", err)
		}
		return true
	}
	return send(&nodev1.ServerMessage{Msg: &nodev1.ServerMessage_ApproverSets{ApproverSets: &nodev1.ApproverSets{Sets: sets}}}) == nil
}

// deliver sends what the dispatcher put in the session's outbox, in
// order, and reports what it sent. A poke on the node's bus topic (this
// process signed something for it) asks the dispatcher to fetch for this
// node. When it returns it reports the session ended, after its last
// send: what it sent that the node never reported on goes back to the
// queue. It also sends the approver sets again when approverPoke says they
// changed: one goroutine per session for both, since every goroutine is
// memory held for each of a gateway's sessions.
func (g *Gateway) deliver(ctx context.Context, s *session, send sender, approverPoke <-chan struct{}) {
	busPoke, stop := g.poke.Subscribe(bus.NodeTopic(s.nodeID))
	defer stop()
	d := g.disp
	defer d.sessionEnded(s.nodeID, s.id)
	d.wantNode(s.nodeID) // what was queued before the session came up
	for {
		batch := d.take(s.out)
		for i, c := range batch {
			if err := send(&nodev1.ServerMessage{Msg: &nodev1.ServerMessage_Command{Command: c}}); err != nil {
				d.release(batch[i:])
				return
			}
			d.markSent(s.id, c.Id)
		}
		switch {
		case len(batch) >= perNodeBatch:
			d.wantNode(s.nodeID) // there may be more
		case len(batch) > 0:
			d.wakeUp() // record what was sent
		}
		select {
		case <-ctx.Done():
			return
		case <-busPoke:
			d.wantNode(s.nodeID)
		case <-s.out.wake:
		case <-approverPoke:
			if !g.sendApproverSets(ctx, s.nodeID, send) {
				return
			}
		}
	}
}

// updateAck is the answer to one update: the state recorded, or, for an
// update that was not recorded, only the refusal's code (never the
// error's text), so the node knows to keep it and send it again.
func updateAck(r wire.UpdateResult) *nodev1.UpdateAck {
	if r.Err != nil {
		return &nodev1.UpdateAck{CommandId: r.CommandID, Refused: string(errs.CodeOf(r.Err))}
	}
	return &nodev1.UpdateAck{CommandId: r.CommandID, State: r.State}
}
