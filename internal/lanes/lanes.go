// Package lanes is the control plane's `lanes` role: its end of every
// bastion's user-space WireGuard tunnel, and the one place the control
// plane opens a lane on a bastion from.
//
// One WireGuard device (internal/bastion/wgtun) listens on a UDP port and
// holds one peer per paired bastion, each allowed exactly that bastion's
// tunnel address; the device's own address is HostAddr. Bastions dial it
// (the bastion dials out); the role dials the bastions' gated listeners
// inside the tunnel (Connect) and takes the egress lane's parked workers
// on EgressPort. Peers follow the bastions module: a poke (a bastion
// paired, unpaired or re-keyed) or a periodic sync adds and removes them,
// so an unpaired bastion's tunnel is down within a sync.
package lanes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bettercompute/bettercompute/internal/bastion/egresslane"
	"github.com/bettercompute/bettercompute/internal/bastion/wgtun"
	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
)

// HostAddr is the control plane's single tunnel address: the only address
// a bastion's tunnel allows.
var HostAddr = netip.MustParseAddr("100.100.0.1")

// Tunnel ports (the bastion's gated listeners, and the host's egress port).
const (
	PortOllama    = 11434
	PortLLM       = 18001
	PortPII       = 18002
	SlotFirstPort = 18100
	SlotLastPort  = 18199
	EgressPort    = 18300
	// PortOps is the bastion's ops server (POST /v1/op, GET
	// /v1/terminal): reached only through DialOps, never as a lane.
	PortOps = 18400
)

// SyncEvery is how often peers are re-read without a poke.
const SyncEvery = 2 * time.Second

// Peer is a paired bastion's end of the tunnel.
type Peer struct {
	BastionID string
	PublicKey string // base64
	Addr      netip.Addr
}

// Source is what the role reads peers and its key from (the bastions
// module).
type Source interface {
	// LanesKey returns the control plane's WireGuard private key (base64),
	// made on first use and sealed at rest.
	LanesKey(ctx context.Context) (private string, err error)
	// Peers returns the paired bastions that sent a WireGuard key.
	Peers(ctx context.Context) ([]Peer, error)
}

// Poker delivers pokes (the in-process bus implements it).
type Poker interface {
	Subscribe(topic string) (<-chan struct{}, func())
}

// Config configures the role.
type Config struct {
	// Listen is the UDP address the tunnel listens on ("127.0.0.1:0" in
	// dev; ":51820" in production).
	Listen string
	// Advertise is the host:port bastions dial; empty: Listen with the
	// port the system picked.
	Advertise string
	Source    Source
	Poke      Poker
	Clock     clock.Clock
	Log       *slog.Logger
}

// Role is the running lanes role.
type Role struct {
	cfg      Config
	tun      *wgtun.Tunnel
	pub      wgtun.Key
	endpoint string
	egress   *egresslane.Dispatcher

	mu       sync.Mutex
	peers    map[string]Peer // by bastion id
	byAddr   map[netip.Addr]string
	services map[string][]string // bastion id -> service names, in slot order
	// active counts each bastion's open Bastion streams: only a bastion
	// with one is a peer, so a revoked, expired or quarantined bastion
	// (whose stream the gateway ends) has no tunnel either.
	active map[string]int
}

// Start brings the control plane's tunnel up and keeps its peers in step
// with the bastions module until ctx ends.
func Start(ctx context.Context, cfg Config) (*Role, error) {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	priv, err := cfg.Source.LanesKey(ctx)
	if err != nil {
		return nil, fmt.Errorf("lanes: key: %w", err)
	}
	key, err := wgtun.ParseKey(priv)
	if err != nil {
		return nil, fmt.Errorf("lanes: key: %w", err)
	}
	ap, err := netip.ParseAddrPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("lanes: listen %q: want ip:port: %w", cfg.Listen, err)
	}
	tun, err := wgtun.Up(wgtun.Config{PrivateKey: key, Address: HostAddr, ListenPort: ap.Port(), ListenAddr: ap.Addr(), Log: cfg.Log})
	if err != nil {
		return nil, fmt.Errorf("lanes: tunnel: %w", err)
	}
	r := &Role{cfg: cfg, tun: tun, pub: key.Public(), egress: egresslane.NewDispatcher(cfg.Clock, cfg.Log),
		peers: map[string]Peer{}, byAddr: map[netip.Addr]string{}, services: map[string][]string{}, active: map[string]int{}}
	r.endpoint = cfg.Advertise
	if r.endpoint == "" {
		host := ap.Addr()
		if host.IsUnspecified() {
			host = netip.MustParseAddr("127.0.0.1")
		}
		r.endpoint = netip.AddrPortFrom(host, tun.Port()).String()
	}
	ln, err := tun.ListenTCP(EgressPort)
	if err != nil {
		tun.Close()
		return nil, fmt.Errorf("lanes: egress listener: %w", err)
	}
	go func() { _ = r.egress.Serve(ctx, ln, r.who) }()
	if err := r.Sync(ctx); err != nil {
		cfg.Log.Warn("lanes sync", "err", err)
	}
	go r.follow(ctx)
	go func() {
		<-ctx.Done()
		tun.Close()
	}()
	return r, nil
}

// PublicKey is the control plane's WireGuard public key (base64).
func (r *Role) PublicKey() string { return r.pub.String() }

// Endpoint is the UDP host:port bastions dial.
func (r *Role) Endpoint() string { return r.endpoint }

// follow syncs peers on every poke and every SyncEvery.
func (r *Role) follow(ctx context.Context) {
	poke, stop := r.cfg.Poke.Subscribe(bus.TopicBastions)
	defer stop()
	remote, stopRemote := r.cfg.Poke.Subscribe(bus.RemoteTopic(bus.TopicBastions))
	defer stopRemote()
	t := r.cfg.Clock.NewTicker(SyncEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-poke:
		case <-remote:
		case <-t.C():
		}
		if err := r.Sync(ctx); err != nil && ctx.Err() == nil {
			r.cfg.Log.Warn("lanes sync", "err", err)
		}
	}
}

// Sync makes the tunnel's peers exactly the paired bastions': new ones
// added, re-keyed ones replaced, unpaired ones removed (their tunnel goes
// down and their parked egress workers are dropped).
func (r *Role) Sync(ctx context.Context) error {
	ps, err := r.cfg.Source.Peers(ctx)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	want := map[string]Peer{}
	for _, p := range ps {
		if r.active[p.BastionID] > 0 {
			want[p.BastionID] = p
		}
	}
	var errsOut []error
	for id, old := range r.peers {
		if p, ok := want[id]; !ok || p.PublicKey != old.PublicKey || p.Addr != old.Addr {
			errsOut = append(errsOut, r.removeLocked(old))
		}
	}
	for id, p := range want {
		if _, ok := r.peers[id]; ok {
			continue
		}
		k, err := wgtun.ParseKey(p.PublicKey)
		if err != nil {
			errsOut = append(errsOut, fmt.Errorf("lanes: bastion %s key: %w", id, err))
			continue
		}
		if err := r.tun.AddPeer(wgtun.Peer{PublicKey: k, AllowedIP: netip.PrefixFrom(p.Addr, p.Addr.BitLen())}); err != nil {
			errsOut = append(errsOut, err)
			continue
		}
		r.peers[id], r.byAddr[p.Addr] = p, id
	}
	return errors.Join(errsOut...)
}

// removeLocked removes one peer; r.mu is held.
func (r *Role) removeLocked(p Peer) error {
	delete(r.peers, p.BastionID)
	delete(r.byAddr, p.Addr)
	r.egress.Drop(p.BastionID)
	k, err := wgtun.ParseKey(p.PublicKey)
	if err != nil {
		return nil
	}
	return r.tun.RemovePeer(k)
}

// who maps an egress worker's tunnel address to its bastion.
func (r *Role) who(a net.Addr) (string, bool) {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return "", false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	id, ok := r.byAddr[ap.Addr().Unmap()]
	return id, ok
}

// EgressParked is how many egress workers the bastion has parked here.
func (r *Role) EgressParked(bastionID string) int { return r.egress.Parked(bastionID) }

// Activate records an open Bastion stream of the bastion (its peer is
// added at the next Sync).
func (r *Role) Activate(bastionID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.active[bastionID]++
}

// Deactivate records the end of one of the bastion's Bastion streams;
// with none left its peer goes at the next Sync.
func (r *Role) Deactivate(bastionID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.active[bastionID]--; r.active[bastionID] <= 0 {
		delete(r.active, bastionID)
	}
}

// SetServices records a bastion's service names in slot order (from its
// hello), so that service/NAME lanes find their port.
func (r *Role) SetServices(bastionID string, names []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.services[bastionID] = append([]string(nil), names...)
}

// Connected reports whether the bastion's tunnel had a handshake within
// the last three minutes (WireGuard re-keys every two).
func (r *Role) Connected(bastionID string) bool {
	r.mu.Lock()
	p, ok := r.peers[bastionID]
	r.mu.Unlock()
	if !ok {
		return false
	}
	k, err := wgtun.ParseKey(p.PublicKey)
	if err != nil {
		return false
	}
	at, ok := r.tun.LastHandshake(k)
	return ok && r.cfg.Clock.Now().Sub(at) < 3*time.Minute
}

// Lane errors.
var (
	errNoTunnel = errs.New(errs.InvalidState, "the bastion has no tunnel up")
	errBadLane  = errs.New(errs.InvalidInput, "lane: one of inference/ollama, inference/llm, inference/pii, service/NAME, egress/HOST:PORT")
)

// Connect opens lane on the bastion through the tunnel: an inference
// forward or service slot inside the tunnel, or an egress connection
// through a parked worker. The bastion checks every one at accept.
func (r *Role) Connect(ctx context.Context, bastionID, lane string) (net.Conn, error) {
	r.mu.Lock()
	p, ok := r.peers[bastionID]
	svcs := r.services[bastionID]
	r.mu.Unlock()
	if !ok {
		return nil, errNoTunnel
	}
	if target, ok := strings.CutPrefix(lane, "egress/"); ok {
		return r.dialEgress(ctx, bastionID, target)
	}
	port, err := lanePort(lane, svcs)
	if err != nil {
		return nil, err
	}
	c, err := r.tun.DialContext(ctx, "tcp", netip.AddrPortFrom(p.Addr, port).String())
	if err != nil {
		return nil, errs.New(errs.Unavailable, "the bastion did not answer on lane "+lane)
	}
	return c, nil
}

// DialOps opens a connection to the bastion's ops server (PortOps) inside
// its tunnel, for the bastions module's ops and terminals: INVALID_STATE
// when the bastion has no tunnel up, UNAVAILABLE when it does not answer.
// The lane endpoint never reaches this port (lanePort has no lane for it).
func (r *Role) DialOps(ctx context.Context, bastionID string) (net.Conn, error) {
	r.mu.Lock()
	p, ok := r.peers[bastionID]
	r.mu.Unlock()
	if !ok {
		return nil, errNoTunnel
	}
	c, err := r.tun.DialContext(ctx, "tcp", netip.AddrPortFrom(p.Addr, PortOps).String())
	if err != nil {
		return nil, errs.Wrap(errs.Unavailable, "the bastion's ops server did not answer", err)
	}
	return c, nil
}

// EgressWait bounds how long an egress lane waits for a parked worker.
const EgressWait = 10 * time.Second

// dialEgress hands target to one of the bastion's parked egress workers;
// the bastion's refusal comes back as ACCESS_DENIED with its reason.
func (r *Role) dialEgress(ctx context.Context, bastionID, target string) (net.Conn, error) {
	if egresslane.ValidTarget(target) != nil {
		return nil, errs.New(errs.InvalidInput, "egress target: HOST:PORT")
	}
	ctx, cancel := context.WithTimeout(ctx, EgressWait)
	defer cancel()
	c, err := r.egress.Dial(ctx, bastionID, target)
	var re *egresslane.RefusedError
	switch {
	case err == nil:
		return c, nil
	case errors.As(err, &re):
		return nil, errs.New(errs.AccessDenied, "the bastion refused the egress target ("+re.Reason+")")
	case errors.Is(err, egresslane.ErrNoWorker):
		return nil, errs.New(errs.Unavailable, "the bastion has no egress worker parked")
	}
	return nil, errs.New(errs.Unavailable, "the egress lane failed")
}

// lanePort is lane's tunnel port on a bastion serving svcs.
func lanePort(lane string, svcs []string) (uint16, error) {
	switch lane {
	case "inference/ollama":
		return PortOllama, nil
	case "inference/llm":
		return PortLLM, nil
	case "inference/pii":
		return PortPII, nil
	}
	name, ok := strings.CutPrefix(lane, "service/")
	if !ok || name == "" {
		return 0, errBadLane
	}
	for i, s := range svcs {
		if i > SlotLastPort-SlotFirstPort {
			// The gateway refuses a longer list; a slot past the last
			// would be another port (PortOps lies beyond).
			break
		}
		if s == name {
			return uint16(SlotFirstPort + i), nil
		}
	}
	return 0, errs.New(errs.NotFound, "the bastion serves no service "+strconv.Quote(name))
}
