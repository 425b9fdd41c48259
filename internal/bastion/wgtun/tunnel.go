package wgtun

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun/netstack"
)

// Config is one end of a tunnel.
type Config struct {
	PrivateKey Key
	// Address is this end's single tunnel address.
	Address netip.Addr
	// ListenPort 0: the system picks (the bastion). The control plane sets
	// its configured port.
	ListenPort uint16
	// ListenAddr, when set, binds the UDP socket to this one address (the
	// control plane in development and tests: 127.0.0.1). Zero: every IPv4
	// and IPv6 address, one socket each, on the same port.
	ListenAddr netip.Addr
	Peers      []Peer
	// MTU of the tunnel; 0 is DefaultMTU.
	MTU int
	// Log receives this package's refusals (Info) and the device's own
	// lines (Debug). Nil discards.
	Log *slog.Logger
}

// Tunnel is a running tunnel end: a WireGuard device on a user-space
// network stack. It is safe for concurrent use.
type Tunnel struct {
	dev     *device.Device
	tnet    *netstack.Net
	addr    netip.Addr
	selfPub Key
	port    uint16
	log     *slog.Logger

	mu        sync.Mutex
	closed    bool
	peers     map[Key]netip.Addr // public key -> its one allowed address
	byAddr    map[netip.Addr]Key // the reverse
	conns     map[netip.Addr]map[*trackedConn]struct{}
	listeners map[*scopedListener]struct{}
}

// Up checks cfg and every peer in it (CheckScoped and the rules that need
// this end's identity) before it creates anything: a refusal returns a
// *RefusedError with no device, goroutine or socket left behind. Then it
// brings the device up on a user-space network stack and opens the UDP
// socket(s).
func Up(cfg Config) (*Tunnel, error) {
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
	mtu := cfg.MTU
	if mtu == 0 {
		mtu = DefaultMTU
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tdev, tnet, err := netstack.CreateNetTUN([]netip.Addr{cfg.Address}, nil, mtu)
	if err != nil {
		return nil, fmt.Errorf("wgtun: creating the network stack: %w", err)
	}
	bind := conn.NewDefaultBind()
	if cfg.ListenAddr.IsValid() {
		bind = newAddrBind(cfg.ListenAddr)
	}
	dev := device.NewDevice(tdev, bind, deviceLogger(log))
	if err := dev.IpcSet(deviceConfig(cfg)); err != nil {
		dev.Close()
		return nil, fmt.Errorf("wgtun: configuring the device: %w", err)
	}
	if err := dev.Up(); err != nil {
		dev.Close()
		return nil, fmt.Errorf("wgtun: bringing the device up: %w", err)
	}
	st, err := readState(dev)
	if err != nil {
		dev.Close()
		return nil, err
	}
	if st.port == 0 {
		dev.Close()
		return nil, fmt.Errorf("wgtun: device has no UDP port after coming up")
	}
	t := &Tunnel{
		dev: dev, tnet: tnet, addr: cfg.Address, selfPub: cfg.PrivateKey.Public(), port: st.port, log: log,
		peers: map[Key]netip.Addr{}, byAddr: map[netip.Addr]Key{},
		conns: map[netip.Addr]map[*trackedConn]struct{}{}, listeners: map[*scopedListener]struct{}{},
	}
	for _, p := range cfg.Peers {
		t.peers[p.PublicKey] = p.AllowedIP.Addr()
		t.byAddr[p.AllowedIP.Addr()] = p.PublicKey
	}
	log.Debug("tunnel up", "address", cfg.Address, "port", st.port, "public_key", t.selfPub.String(), "peers", len(cfg.Peers))
	return t, nil
}

// deviceLogger sends the device's printf-style lines to log at Debug, with
// a constant message and the line as a field; a line is formatted only when
// Debug is enabled.
func deviceLogger(log *slog.Logger) *device.Logger {
	at := func(msg string) func(string, ...any) {
		return func(format string, args ...any) {
			if log.Enabled(context.Background(), slog.LevelDebug) {
				log.Debug(msg, "line", fmt.Sprintf(format, args...))
			}
		}
	}
	return &device.Logger{Verbosef: at("wireguard device"), Errorf: at("wireguard device error")}
}

// readState reads the device's state back through IpcGet.
func readState(dev *device.Device) (deviceState, error) {
	text, err := dev.IpcGet()
	if err != nil {
		return deviceState{}, fmt.Errorf("wgtun: reading device state: %w", err)
	}
	return parseDeviceState(text), nil
}

// Port is the UDP port the tunnel listens on (the one the system picked when
// Config.ListenPort was 0).
func (t *Tunnel) Port() uint16 { return t.port }

// Address is this end's tunnel address.
func (t *Tunnel) Address() netip.Addr { return t.addr }

// PublicKey is this end's public key (what the other end lists as its peer).
func (t *Tunnel) PublicKey() Key { return t.selfPub }

// AddPeer adds peer p, or replaces the peer with p's key (the control plane
// side: a bastion pairs or re-pairs). p is checked first as Up checks; an
// allowed address that another key holds is refused (ReasonAddressTaken):
// remove that peer first. When a replaced peer's address changes, the
// connections at its old address are closed.
func (t *Tunnel) AddPeer(p Peer) error {
	if err := checkPeer(p, t.selfPub, t.addr); err != nil {
		return err
	}
	addr := p.AllowedIP.Addr()
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return fmt.Errorf("wgtun: add peer: %w", net.ErrClosed)
	}
	if owner, ok := t.byAddr[addr]; ok && owner != p.PublicKey {
		t.mu.Unlock()
		return refuse(ReasonAddressTaken, "allowed address %s is another peer's", addr)
	}
	if err := t.dev.IpcSet(peerConfig(p)); err != nil {
		t.mu.Unlock()
		return fmt.Errorf("wgtun: adding peer: %w", err)
	}
	var stale []*trackedConn
	if old, ok := t.peers[p.PublicKey]; ok && old != addr {
		delete(t.byAddr, old)
		stale = t.takeConnsLocked(old)
	}
	t.peers[p.PublicKey] = addr
	t.byAddr[addr] = p.PublicKey
	t.mu.Unlock()
	closeAll(stale)
	t.log.Debug("tunnel peer added", "peer", p)
	return nil
}

// RemovePeer takes peer k out of the device at once, so nothing from or to
// its key passes any more, and closes every connection this tunnel carried
// for it. Removing a key that is not a peer is not an error.
func (t *Tunnel) RemovePeer(k Key) error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return fmt.Errorf("wgtun: remove peer: %w", net.ErrClosed)
	}
	if err := t.dev.IpcSet(removePeerConfig(k)); err != nil {
		t.mu.Unlock()
		return fmt.Errorf("wgtun: removing peer: %w", err)
	}
	var stale []*trackedConn
	if addr, ok := t.peers[k]; ok {
		delete(t.peers, k)
		delete(t.byAddr, addr)
		stale = t.takeConnsLocked(addr)
	}
	t.mu.Unlock()
	closeAll(stale)
	t.log.Debug("tunnel peer removed", "public_key", k.String(), "connections_closed", len(stale))
	return nil
}

// LastHandshake is when the device last completed a handshake with peer k.
// ok is false when k is not a peer or has never completed one.
func (t *Tunnel) LastHandshake(k Key) (time.Time, bool) {
	st, err := readState(t.dev)
	if err != nil {
		return time.Time{}, false
	}
	at, ok := st.handshake[k]
	if !ok || at.IsZero() {
		return time.Time{}, false
	}
	return at, true
}

// Close closes every listener and connection of the tunnel, then the device
// and its UDP socket(s). Closing twice is not an error.
func (t *Tunnel) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	var all []*trackedConn
	for addr := range t.conns {
		all = append(all, t.takeConnsLocked(addr)...)
	}
	ls := make([]*scopedListener, 0, len(t.listeners))
	for l := range t.listeners {
		ls = append(ls, l)
	}
	t.listeners = map[*scopedListener]struct{}{}
	t.mu.Unlock()
	closeAll(all)
	for _, l := range ls {
		_ = l.Listener.Close()
	}
	t.dev.Close()
	return nil
}
