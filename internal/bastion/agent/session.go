package agent

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/bettercompute/bettercompute/internal/bastion/approval"
	"github.com/bettercompute/bettercompute/internal/bastion/chainlog"
	"github.com/bettercompute/bettercompute/internal/bastion/forward"
	"github.com/bettercompute/bettercompute/internal/bastion/grant"
	"github.com/bettercompute/bettercompute/internal/bastion/ops"
	"github.com/bettercompute/bettercompute/internal/bastion/wgtun"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// ackedFile keeps the last audit seq the control plane acknowledged.
const ackedFile = "audit.acked"

// maxEventsPerMessage caps one BastionEvents message.
const maxEventsPerMessage = 256

// Agent is a running bastion.
type Agent struct {
	cfg     Config
	node    *daemon.Node
	wgKey   wgtun.Key
	audit   *chainlog.Log
	streams *forward.Streams
	bootID  string

	approvals *approval.Store // the second factor, approvals, standing grants
	ops       *ops.Server     // the op server served on PortOps in the tunnel

	grants    atomic.Pointer[[]grant.Doc] // verified, for this bastion
	connected atomic.Bool
	notify    chan struct{} // an audit event was appended

	mu      sync.Mutex
	tun     *wgtun.Tunnel
	tunCfg  string // the configuration the tunnel runs (its fingerprint)
	stopTun func()
}

// Open loads a paired bastion's data folder and checks every forward's
// upstream is this machine (a forward pointed elsewhere refuses to start,
// with a line saying which address and what to set).
func Open(ctx context.Context, cfg Config) (*Agent, error) {
	cfg, err := withDefaults(cfg)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(cfg.DataDir, unpairedFile)); err == nil {
		return nil, ErrUnpaired
	}
	for k, addr := range cfg.Forwards {
		if _, err := forward.CheckUpstream(ctx, k, addr, cfg.Local, cfg.Resolver); err != nil {
			return nil, err
		}
	}
	key, err := readWGKey(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	n, err := daemon.Open(daemon.Config{DataDir: cfg.DataDir, Gateway: cfg.Gateway, Driver: noCommands{}, Clock: cfg.Clock, Log: cfg.Log})
	if err != nil {
		return nil, err
	}
	al, err := chainlog.Open(filepath.Join(cfg.DataDir, auditFile), cfg.Clock)
	if err != nil {
		n.Close()
		return nil, err
	}
	a := &Agent{cfg: cfg, node: n, wgKey: key, audit: al, streams: forward.NewStreams(MaxStreams), bootID: ids.New("b"), notify: make(chan struct{}, 1)}
	a.grants.Store(&[]grant.Doc{})
	if err := a.openOps(); err != nil {
		al.Close()
		n.Close()
		return nil, err
	}
	return a, nil
}

// serviceNames lists the service slots' names in slot order.
func (a *Agent) serviceNames() []string {
	out := make([]string, len(a.cfg.Services))
	for i, s := range a.cfg.Services {
		out[i] = s.Name
	}
	return out
}

// DataDir is the bastion's data folder.
func (a *Agent) DataDir() string { return a.cfg.DataDir }

// ID is the bastion's id (its certificate's node id).
func (a *Agent) ID() string { return a.node.NodeID() }

// Connected reports whether the Bastion stream is up.
func (a *Agent) Connected() bool { return a.connected.Load() }

// TunnelPort is the tunnel's UDP port (0 while no tunnel is up).
func (a *Agent) TunnelPort() uint16 {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.tun == nil {
		return 0
	}
	return a.tun.Port()
}

// AuditSince returns the on-machine audit chain's events after seq (at
// most 1,000), for tools and tests that read what the bastion recorded.
func (a *Agent) AuditSince(seq uint64) ([]chainlog.Event, error) { return a.audit.Since(seq, 1000) }

// LiveStreams is how many streams of the pairing's MaxStreams are held
// now (forwards and service slots).
func (a *Agent) LiveStreams() int { return a.streams.Live() }

// Policy is what the grants held now allow (deny beats allow).
func (a *Agent) Policy() grant.Policy {
	return grant.Effective(*a.grants.Load(), a.cfg.Clock.Now())
}

// Close ends the tunnel and closes the files.
func (a *Agent) Close() error {
	a.downTunnel()
	a.audit.Close()
	return a.node.Close()
}

// Run keeps the Bastion stream up until ctx ends, reconnecting with
// full-jitter back-off. It returns ErrUnpaired after an unpair (keys
// deleted) and ErrRevoked when the certificate was revoked.
func (a *Agent) Run(ctx context.Context) error {
	backoff := a.cfg.MinBackoff
	for {
		configured, err := a.session(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, ErrUnpaired):
			return err
		case isRevoked(err):
			// A revoked bastion is as good as unpaired: its tunnel goes
			// down and its keys are deleted, so a copy of this folder
			// taken later holds nothing.
			a.downTunnel()
			a.record("unpair", "", "certificate-revoked", "", "")
			if ferr := forgetKeys(a.cfg.DataDir); ferr != nil {
				a.cfg.Log.Error("delete bastion keys", "err", ferr)
			}
			a.cfg.Log.Error("bastion certificate revoked: not reconnecting", "bastion_id", a.ID())
			return ErrRevoked
		}
		if configured {
			backoff = a.cfg.MinBackoff
		}
		a.cfg.Log.Info("bastion session ended", "bastion_id", a.ID(), "err", err)
		t := time.NewTimer(time.Duration(rand.Int64N(int64(backoff) + 1)))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		backoff = min(backoff*2, a.cfg.MaxBackoff)
	}
}

func isRevoked(err error) bool {
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.Unauthenticated && st.Message() == wire.RevokedMessage
}

// session runs one Bastion stream; configured reports whether the
// control plane's configuration was accepted.
func (a *Agent) session(ctx context.Context) (configured bool, err error) {
	conn, err := a.node.Connect(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := nodev1.NewGatewayClient(conn).Bastion(sctx)
	if err != nil {
		return false, err
	}
	if err := stream.Send(&nodev1.BastionMessage{Msg: &nodev1.BastionMessage_Hello{Hello: &nodev1.BastionHello{
		BastionId: a.ID(), WgPublicKey: a.wgKey.Public().String(), Version: a.cfg.Version, BootId: a.bootID, Services: a.serviceNames()}}}); err != nil {
		return false, err
	}
	first, err := stream.Recv()
	if err != nil {
		return false, err
	}
	if err := a.applyConfig(ctx, first.GetConfig()); err != nil {
		return false, err
	}
	a.connected.Store(true)
	defer a.connected.Store(false)
	a.cfg.Log.Info("bastion connected", "bastion_id", a.ID(), "tunnel_port", a.TunnelPort())
	sendErr := make(chan error, 1)
	acked := make(chan uint64, 1)
	go func() { sendErr <- a.sendEvents(sctx, stream, acked) }()
	return true, a.receive(stream, acked, sendErr)
}

// receive handles what the gateway sends after the configuration.
func (a *Agent) receive(stream nodev1.Gateway_BastionClient, acked chan<- uint64, sendErr <-chan error) error {
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		select {
		case err := <-sendErr:
			return err
		default:
		}
		switch msg := m.Msg.(type) {
		case *nodev1.BastionServerMessage_Grants:
			a.setGrants(msg.Grants.Grants)
		case *nodev1.BastionServerMessage_Unpair:
			a.record("unpair", "", "", "", "the control plane unpaired this bastion")
			a.downTunnel()
			if err := forgetKeys(a.cfg.DataDir); err != nil {
				a.cfg.Log.Error("delete bastion keys", "err", err)
			}
			return ErrUnpaired
		case *nodev1.BastionServerMessage_EventsAck:
			// The sender takes the latest ack; one not taken yet is
			// replaced (acks only grow).
			select {
			case acked <- msg.EventsAck.Seq:
			case <-sendErr:
				return errors.New("bastion: the event sender stopped")
			}
		default:
			return fmt.Errorf("bastion: unexpected message %T", m.Msg)
		}
	}
}

// setGrants verifies each signed grant under the pinned key; a grant that
// does not verify is dropped and its reason audited.
func (a *Agent) setGrants(signed [][]byte) {
	vkey, err := pinnedGrantKey(a.cfg.DataDir)
	if err != nil || vkey == "" {
		// Fail closed: with no key to verify under, no grant holds, not
		// even one held before.
		a.grants.Store(&[]grant.Doc{})
		a.record("refuse", "grants", "grant-key-not-pinned", "", "")
		return
	}
	now := a.cfg.Clock.Now()
	docs := make([]grant.Doc, 0, len(signed))
	for _, s := range signed {
		d, reason := grant.Verify(s, vkey, a.ID(), now)
		if reason != "" {
			a.record("refuse", "grants", string(reason), "", "")
			continue
		}
		docs = append(docs, d)
	}
	a.grants.Store(&docs)
	a.record("grants", "", "", "", "families "+strings.Join(grant.Effective(docs, now).Families(), ","))
}

// record appends one event to the on-machine chain and wakes the sender.
func (a *Agent) record(kind, lane, reason, peer, detail string) {
	if _, err := a.audit.Append(chainlog.Event{Kind: kind, Lane: lane, Reason: reason, Peer: peer, Detail: detail}); err != nil {
		a.cfg.Log.Error("bastion audit append", "err", err)
		return
	}
	if kind == "refuse" {
		a.cfg.Log.Info("bastion refused", "lane", lane, "reason", reason, "peer", peer)
	}
	select {
	case a.notify <- struct{}{}:
	default:
	}
}

// sendEvents sends the chain's events the control plane has not
// acknowledged, as they are appended.
func (a *Agent) sendEvents(ctx context.Context, stream nodev1.Gateway_BastionClient, acked <-chan uint64) error {
	done := readAcked(a.cfg.DataDir)
	sent := done
	for {
		evs, err := a.audit.Since(sent, maxEventsPerMessage)
		if err != nil {
			return err
		}
		if len(evs) > 0 {
			if err := stream.Send(&nodev1.BastionMessage{Msg: &nodev1.BastionMessage_Events{Events: &nodev1.BastionEvents{Events: toProto(evs)}}}); err != nil {
				return err
			}
			sent = evs[len(evs)-1].Seq
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-a.notify:
		case seq := <-acked:
			if seq > done && seq <= sent {
				done = seq
				writeAcked(a.cfg.DataDir, done)
			}
		}
	}
}

func toProto(evs []chainlog.Event) []*nodev1.BastionEvent {
	out := make([]*nodev1.BastionEvent, len(evs))
	for i, e := range evs {
		out[i] = &nodev1.BastionEvent{Seq: e.Seq, TimeMs: e.TimeMS, Kind: e.Kind, Lane: e.Lane, Reason: e.Reason, Peer: e.Peer, Detail: e.Detail, Hash: e.Hash}
	}
	return out
}

func readAcked(dir string) uint64 {
	b, err := os.ReadFile(filepath.Join(dir, ackedFile))
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return n
}

func writeAcked(dir string, seq uint64) {
	_ = os.WriteFile(filepath.Join(dir, ackedFile), []byte(strconv.FormatUint(seq, 10)+"\n"), 0o600)
}

// tunnelPlan is a checked BastionConfig.
type tunnelPlan struct {
	host     wgtun.Peer
	self     netip.Addr
	egress   uint16
	grantKey string
}

// planTunnel checks the control plane's configuration: keys and addresses
// well formed, the host's allowed address exactly one address (wgtun's
// scope rule), an endpoint to dial.
func planTunnel(c *nodev1.BastionConfig) (tunnelPlan, error) {
	if c == nil {
		return tunnelPlan{}, errors.New("bastion: the gateway sent no tunnel configuration")
	}
	hostKey, err := wgtun.ParseKey(c.HostPublicKey)
	if err != nil {
		return tunnelPlan{}, fmt.Errorf("bastion: host key: %w", err)
	}
	hostPrefix, err1 := netip.ParsePrefix(c.HostAddress)
	self, err2 := netip.ParsePrefix(c.BastionAddress)
	if err1 != nil || err2 != nil || !self.IsSingleIP() {
		return tunnelPlan{}, errors.New("bastion: malformed tunnel addresses")
	}
	ep, err := resolveEndpoint(c.HostEndpoint)
	if err != nil {
		return tunnelPlan{}, err
	}
	p := wgtun.Peer{PublicKey: hostKey, AllowedIP: hostPrefix, Endpoint: ep, Keepalive: 25 * time.Second}
	if err := wgtun.CheckScoped(p); err != nil {
		return tunnelPlan{}, err
	}
	if c.EgressPort == 0 || c.EgressPort > 65535 || c.GrantVerifyKey == "" {
		return tunnelPlan{}, errors.New("bastion: incomplete tunnel configuration")
	}
	return tunnelPlan{host: p, self: self.Addr(), egress: uint16(c.EgressPort), grantKey: c.GrantVerifyKey}, nil
}

// resolveEndpoint turns the host's UDP endpoint into one address.
func resolveEndpoint(s string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap, nil
	}
	ua, err := net.ResolveUDPAddr("udp", s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("bastion: host endpoint %q: %w", s, err)
	}
	return ua.AddrPort(), nil
}

// applyConfig checks the configuration, pins the grant key on first use,
// and brings the tunnel up (again only when the configuration changed).
// A refused configuration brings no tunnel up and is audited.
func (a *Agent) applyConfig(ctx context.Context, c *nodev1.BastionConfig) error {
	plan, err := planTunnel(c)
	if err != nil {
		var re *wgtun.RefusedError
		reason := "tunnel-config-invalid"
		if errors.As(err, &re) {
			reason = re.Reason
		}
		a.record("refuse", "tunnel", reason, "", "")
		a.downTunnel()
		return err
	}
	if err := pinGrantKey(a.cfg.DataDir, plan.grantKey); err != nil {
		a.record("refuse", "tunnel", "grant-key-changed", "", "")
		a.downTunnel()
		return err
	}
	fp := fmt.Sprintf("%s|%s|%s|%s|%d", plan.host.PublicKey.String(), plan.host.AllowedIP, plan.host.Endpoint, plan.self, plan.egress)
	a.mu.Lock()
	same := a.tun != nil && a.tunCfg == fp
	a.mu.Unlock()
	if same {
		return nil
	}
	a.downTunnel()
	return a.upTunnel(ctx, plan, fp)
}

// noCommands is the bastion's driver: a bastion certificate is allowed no
// command kind and opens no node session, so nothing ever reaches Run; if
// something did, it is refused.
type noCommands struct{}

func (noCommands) Name() string                 { return "bastion" }
func (noCommands) Inventory() *nodev1.Inventory { return &nodev1.Inventory{} }
func (noCommands) Run(context.Context, string, []byte) ([]byte, error) {
	return nil, errors.New("a bastion runs no commands")
}

var _ driver.Driver = noCommands{}
