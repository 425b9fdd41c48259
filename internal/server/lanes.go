package server

import (
	"context"
	"database/sql"
	"net"
	"net/netip"

	"github.com/bettercompute/bettercompute/internal/api"
	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/bastions"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/gateway"
	"github.com/bettercompute/bettercompute/internal/lanes"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/store"
)

// startLanes starts the lanes role: the control plane's end of the
// bastions' tunnels, with its peers from the bastions module.
func (cp *ControlPlane) startLanes(o Options) error {
	l, err := lanes.Start(cp.ctx, lanes.Config{Listen: o.LanesListen, Advertise: o.LanesAdvertise,
		Source: laneSource{cp.Bastions}, Poke: cp.Bus, Clock: o.Clock, Log: o.Log})
	if err != nil {
		return err
	}
	cp.Lanes = l
	// Ops and terminals reach bastions through this role's tunnel.
	cp.Bastions.SetOpsDialer(l)
	o.Log.Info("lanes role started", "endpoint", l.Endpoint())
	return nil
}

// serveBastionLanes enables the API's lane and terminal endpoints when
// this process runs the lanes role (else their paths are unknown
// methods, and bastions.op answers UNAVAILABLE).
func (cp *ControlPlane) serveBastionLanes(srv *api.Server, o Options) {
	if cp.Lanes == nil || cp.Bastions == nil {
		return
	}
	srv.ServeBastionLanes(laneOpener{db: cp.DB, l: cp.Lanes, o: o})
	srv.ServeBastionTerminals(cp.Bastions)
}

// laneSource reads the lanes role's key and peers from the bastions
// module.
type laneSource struct{ b *bastions.Service }

func (s laneSource) LanesKey(ctx context.Context) (string, error) {
	k, _, err := s.b.LanesKey(ctx)
	if err != nil {
		return "", err
	}
	return k.String(), nil
}

func (s laneSource) Peers(ctx context.Context) ([]lanes.Peer, error) {
	ps, err := s.b.Peers(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]lanes.Peer, len(ps))
	for i, p := range ps {
		out[i] = lanes.Peer{BastionID: p.BastionID, PublicKey: p.PublicKey.String(), Addr: p.Addr}
	}
	return out, nil
}

// bastionServices returns the gateway's bastion services: nil (bastions
// refused UNAVAILABLE) unless this process runs the lanes role.
func (cp *ControlPlane) bastionServices() gateway.BastionServices {
	if cp.Lanes == nil || cp.Bastions == nil {
		return nil
	}
	return bastionServices{b: cp.Bastions, l: cp.Lanes}
}

// bastionServices is what the gateway serves bastions' streams with: the
// bastions module and this process's lanes role.
type bastionServices struct {
	b *bastions.Service
	l *lanes.Role
}

func (s bastionServices) BastionHello(ctx context.Context, id, key string, services []string) (*nodev1.BastionConfig, error) {
	t, err := s.b.Hello(ctx, id, key)
	if err != nil {
		return nil, err
	}
	s.l.SetServices(id, services)
	// The peer is added now, not at the next sync, so the bastion's first
	// handshake is answered; it stays while this stream does.
	s.l.Activate(id)
	if err := s.l.Sync(ctx); err != nil {
		s.l.Deactivate(id)
		return nil, err
	}
	host, err := netip.ParseAddr(t.HostAddr)
	if err != nil {
		return nil, err
	}
	self, err := netip.ParseAddr(t.BastionAddr)
	if err != nil {
		return nil, err
	}
	return &nodev1.BastionConfig{HostPublicKey: t.HostPublicKey, HostEndpoint: s.l.Endpoint(),
		HostAddress: netip.PrefixFrom(host, host.BitLen()).String(), BastionAddress: netip.PrefixFrom(self, self.BitLen()).String(),
		GrantVerifyKey: t.GrantVerifyKey, EgressPort: lanes.EgressPort}, nil
}

func (s bastionServices) BastionClosed(ctx context.Context, id string) {
	s.l.Deactivate(id)
	_ = s.l.Sync(ctx)
}

func (s bastionServices) BastionGrants(ctx context.Context, id string) ([][]byte, error) {
	return s.b.SignedGrants(ctx, id)
}

func (s bastionServices) BastionPaired(ctx context.Context, id string) (bool, error) {
	return s.b.Paired(ctx, id)
}

func (s bastionServices) BastionEvents(ctx context.Context, id string, evs []*nodev1.BastionEvent) error {
	out := make([]bastions.LaneEvent, len(evs))
	for i, e := range evs {
		out[i] = bastions.LaneEvent{Seq: e.Seq, Kind: e.Kind, Lane: e.Lane, Reason: e.Reason, Peer: e.Peer, Hash: e.Hash}
	}
	return s.b.RecordLaneEvents(ctx, id, out)
}

// laneOpener opens lanes for the API's lane endpoint through the lanes
// role, and records each opening (or its failure) in the audit log.
type laneOpener struct {
	db *store.DB
	l  *lanes.Role
	o  Options
}

func (lo laneOpener) OpenLane(ctx context.Context, actor audit.Entry, bastionID, lane string) (net.Conn, error) {
	c, err := lo.l.Connect(ctx, bastionID, lane)
	actor.Action, actor.Resource, actor.Outcome = "compute:bastions:connect", "bastion/"+bastionID, "allowed"
	actor.Details = map[string]any{"lane": lane}
	if err != nil {
		actor.Outcome = "refused"
		actor.Details["reason"] = string(errs.CodeOf(err))
	}
	if aerr := lo.db.Tx(ctx, func(tx *sql.Tx) error { return audit.Record(ctx, tx, lo.o.Clock.Now(), actor) }); aerr != nil {
		if c != nil {
			c.Close()
		}
		return nil, aerr
	}
	return c, err
}
