package gateway

import (
	"bytes"
	"context"
	"errors"
	"regexp"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// BastionServices is what the gateway needs to serve Bastion streams: the
// bastions module (keys, grants, audit) and the lanes role's tunnel
// endpoint. Nil in Config: every Bastion stream is refused UNAVAILABLE.
type BastionServices interface {
	// BastionHello records the WireGuard public key the bastion made and
	// returns its tunnel's configuration. An unpaired bastion is refused
	// with an errs.AccessDenied error.
	// services are the bastion's service-slot names, in slot order.
	BastionHello(ctx context.Context, bastionID, wgPublicKey string, services []string) (*nodev1.BastionConfig, error)
	// BastionGrants returns the bastion's live signed grants.
	BastionGrants(ctx context.Context, bastionID string) ([][]byte, error)
	// BastionPaired reports whether the bastion is still paired.
	BastionPaired(ctx context.Context, bastionID string) (bool, error)
	// BastionClosed says a stream BastionHello opened has ended: the
	// bastion's tunnel peer goes with its last stream.
	BastionClosed(ctx context.Context, bastionID string)
	// BastionEvents records the bastion's on-machine audit events in the
	// control plane's audit log, in the bastion's tenant.
	BastionEvents(ctx context.Context, bastionID string, evs []*nodev1.BastionEvent) error
}

// MaxBastionEvents caps the events of one BastionEvents message.
const MaxBastionEvents = 256

// maxWGKeyLen bounds the base64 WireGuard key in a BastionHello.
const maxWGKeyLen = 64

var errNotBastion = status.Error(codes.PermissionDenied, string(errs.AccessDenied))

// Bastion serves a paired bastion's stream: it reads the BastionHello,
// records the bastion's WireGuard key, sends the tunnel's configuration
// and the signed grants, then relays audit events up and grant changes
// down until the stream ends, the bastion is unpaired (it is told so and
// the stream closes), or its certificate is revoked or expires. Only a
// bastion-role certificate reaches here (see admit).
func (g *Gateway) Bastion(stream nodev1.Gateway_BastionServer) error {
	ctx := stream.Context()
	c, err := mustCaller(ctx, nodev1.Gateway_Bastion_FullMethodName)
	if err != nil {
		return err
	}
	if c.id.Role != pki.RoleBastion {
		return errNotBastion
	}
	if g.cfg.Bastions == nil {
		return status.Error(codes.Unavailable, "this gateway serves no bastions")
	}
	hello, err := g.readBastionHello(stream, c.id.NodeID)
	if err != nil {
		return err
	}
	// Subscribed before the configuration and grants go out, so that a
	// change made meanwhile is never missed.
	poke, stop := g.poke.Subscribe(bus.TopicBastions)
	defer stop()
	remote, stopRemote := g.poke.Subscribe(bus.RemoteTopic(bus.TopicBastions))
	defer stopRemote()
	// The registry sees the session first, so a bastion whose copy was
	// just quarantined records no key and gets no tunnel.
	sessionID := ids.New("s")
	res, err := g.reg.OpenSession(ctx, HelloInfo{NodeID: c.id.NodeID, BootID: BootTag(hello.BootId), Serial: c.id.Serial,
		SessionID: sessionID, GatewayID: g.cfg.GatewayID, Version: hello.Version})
	if err != nil {
		g.cfg.Log.Error("open bastion session", "bastion_id", c.id.NodeID, "err", err)
		return status.Error(codes.Internal, string(errs.Internal))
	}
	defer func() {
		if err := g.reg.CloseSession(context.WithoutCancel(ctx), c.id.NodeID, sessionID); err != nil {
			g.cfg.Log.Error("close bastion session", "bastion_id", c.id.NodeID, "err", err)
		}
	}()
	if res.Quarantined {
		return errCertRevoked
	}
	bs := &bastionStream{g: g, stream: stream, id: c.id}
	if err := bs.hello(ctx, hello); err != nil {
		return err
	}
	// The tunnel's peer lives only as long as this stream: a revoked,
	// expired, quarantined or unpaired bastion loses both together.
	defer g.cfg.Bastions.BastionClosed(context.WithoutCancel(ctx), c.id.NodeID)
	if err := bs.open(ctx); err != nil {
		return err
	}
	g.cfg.Log.Info("bastion session open", "bastion_id", c.id.NodeID, "session_id", sessionID)
	return bs.serve(ctx, poke, remote)
}

// readBastionHello reads the stream's first message, which must be a
// BastionHello of the authenticated bastion with a key of sane length.
func (g *Gateway) readBastionHello(stream nodev1.Gateway_BastionServer, bastionID string) (*nodev1.BastionHello, error) {
	first, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	h := first.GetHello()
	if h == nil || h.BastionId != bastionID || h.WgPublicKey == "" || len(h.WgPublicKey) > maxWGKeyLen ||
		h.BootId == "" || len(h.BootId) > 64 || len(h.Version) > 64 || !validServices(h.Services) {
		g.cfg.Log.Info("bastion refused", "bastion_id", bastionID, "why", "first message is not a well-formed BastionHello for this bastion")
		return nil, errNotBastion
	}
	return h, nil
}

// serviceName is a service slot's name.
var serviceName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// validServices: at most 100 slot names, each well formed, none twice.
func validServices(names []string) bool {
	if len(names) > 100 {
		return false
	}
	seen := map[string]bool{}
	for _, n := range names {
		if !serviceName.MatchString(n) || seen[n] {
			return false
		}
		seen[n] = true
	}
	return true
}

// bastionStream is one bastion's open stream.
type bastionStream struct {
	g      *Gateway
	stream nodev1.Gateway_BastionServer
	id     pki.NodeIdentity
	sent   [][]byte // the grants last sent
	cfg    *nodev1.BastionConfig
}

// hello records the hello (the bastion's key and services, its peer
// activated); open then sends the configuration and the grants.
func (b *bastionStream) hello(ctx context.Context, h *nodev1.BastionHello) error {
	cfg, err := b.g.cfg.Bastions.BastionHello(ctx, b.id.NodeID, h.WgPublicKey, h.Services)
	if err != nil {
		var e *errs.Error
		if errors.As(err, &e) && (e.Code == errs.AccessDenied || e.Code == errs.InvalidInput) {
			b.g.cfg.Log.Info("bastion refused", "bastion_id", b.id.NodeID, "err", err)
			return errNotBastion
		}
		b.g.cfg.Log.Error("bastion hello", "bastion_id", b.id.NodeID, "err", err)
		return status.Error(codes.Internal, string(errs.Internal))
	}
	b.cfg = cfg
	return nil
}

// open sends the configuration and the grants.
func (b *bastionStream) open(ctx context.Context) error {
	if err := b.stream.Send(&nodev1.BastionServerMessage{Msg: &nodev1.BastionServerMessage_Config{Config: b.cfg}}); err != nil {
		return err
	}
	return b.sendGrants(ctx, true)
}

// sendGrants sends the live grants when they changed since the last send
// (always when force).
func (b *bastionStream) sendGrants(ctx context.Context, force bool) error {
	gs, err := b.g.cfg.Bastions.BastionGrants(ctx, b.id.NodeID)
	if err != nil {
		b.g.cfg.Log.Error("read bastion grants", "bastion_id", b.id.NodeID, "err", err)
		return nil // the next poke or tick tries again
	}
	if !force && sameGrants(gs, b.sent) {
		return nil
	}
	b.sent = gs
	return b.stream.Send(&nodev1.BastionServerMessage{Msg: &nodev1.BastionServerMessage_Grants{Grants: &nodev1.BastionGrants{Grants: gs}}})
}

func sameGrants(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// serve runs the stream until it ends: events from the bastion are
// recorded and acknowledged; a poke or tick re-checks the pairing and the
// certificate and sends changed grants.
func (b *bastionStream) serve(ctx context.Context, poke, remote <-chan struct{}) error {
	recv := make(chan *nodev1.BastionMessage)
	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := b.stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case recv <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	tick := b.g.cfg.Clock.NewTicker(b.g.cfg.RevocationPoll)
	defer tick.Stop()
	expiry := b.g.cfg.Clock.NewTimer(b.id.NotAfter.Sub(b.g.cfg.Clock.Now()))
	defer expiry.Stop()
	for {
		select {
		case m := <-recv:
			if err := b.events(ctx, m); err != nil {
				return err
			}
		case err := <-recvErr:
			b.g.cfg.Log.Info("bastion session closed", "bastion_id", b.id.NodeID, "why", err)
			return nil
		case <-poke:
			if err := b.recheck(ctx); err != nil {
				return err
			}
		case <-remote:
			if err := b.recheck(ctx); err != nil {
				return err
			}
		case <-tick.C():
			if err := b.recheck(ctx); err != nil {
				return err
			}
		case <-expiry.C():
			return errUnauthenticated
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// events records one BastionEvents message and acknowledges it; any other
// message after the hello ends the stream.
func (b *bastionStream) events(ctx context.Context, m *nodev1.BastionMessage) error {
	ev := m.GetEvents()
	if ev == nil || len(ev.Events) == 0 || len(ev.Events) > MaxBastionEvents {
		b.g.cfg.Log.Info("bastion refused", "bastion_id", b.id.NodeID, "why", "not a BastionEvents message of 1 to 256 events")
		return status.Error(codes.InvalidArgument, string(errs.InvalidInput))
	}
	if err := b.g.cfg.Bastions.BastionEvents(ctx, b.id.NodeID, ev.Events); err != nil {
		// The stream ends, so the bastion reconnects and sends again
		// everything after the last acknowledged event: none is lost.
		b.g.cfg.Log.Warn("bastion events not recorded", "bastion_id", b.id.NodeID, "err", err)
		return status.Error(codes.Unavailable, "events not recorded")
	}
	last := ev.Events[len(ev.Events)-1].Seq
	return b.stream.Send(&nodev1.BastionServerMessage{Msg: &nodev1.BastionServerMessage_EventsAck{EventsAck: &nodev1.BastionEventsAck{Seq: last}}})
}

// recheck ends the stream of a bastion no longer paired (telling it so)
// or whose certificate was revoked, and sends changed grants otherwise.
// A check that cannot be made now is made at the next tick.
func (b *bastionStream) recheck(ctx context.Context) error {
	paired, err := b.g.cfg.Bastions.BastionPaired(ctx, b.id.NodeID)
	if err != nil {
		b.g.cfg.Log.Error("read bastion pairing", "bastion_id", b.id.NodeID, "err", err)
		return nil
	}
	if !paired {
		b.g.cfg.Log.Info("bastion unpaired", "bastion_id", b.id.NodeID)
		_ = b.stream.Send(&nodev1.BastionServerMessage{Msg: &nodev1.BastionServerMessage_Unpair{Unpair: &nodev1.BastionUnpair{}}})
		return errCertRevoked
	}
	ci, err := b.g.reg.CertInfo(ctx, b.id.Serial)
	if err == nil && ci.Revoked {
		b.g.cfg.Log.Info("bastion certificate revoked", "bastion_id", b.id.NodeID, "serial", b.id.Serial)
		return errCertRevoked
	}
	return b.sendGrants(ctx, false)
}
