package wgtun

import (
	"crypto/rand"
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/bastion/sockets"
)

// The cp dials the bastion's gated listener through the tunnel; bytes go
// both ways; the bastion sees the cp's tunnel address. Removing the
// bastion's peer closes the live connection and a new dial fails, both at
// this package's check and at the WireGuard layer underneath it.
func TestTunnelEchoThenRemovePeer(t *testing.T) {
	p := newPair(t, nil)
	ln, err := p.bastion.ListenTCP(11434)
	if err != nil {
		t.Fatal(err)
	}
	remotes := make(chan netip.Addr, 4)
	go serveEcho(ln, remotes)

	c, err := p.cp.DialContext(dialCtx(t, 10*time.Second), "tcp", "100.100.0.2:11434")
	if err != nil {
		t.Fatalf("dial through the tunnel: %v", err)
	}
	big := make([]byte, 256<<10)
	_, _ = rand.Read(big)
	echoOnce(t, c, []byte("hello through the tunnel"))
	echoOnce(t, c, big)
	if got := <-remotes; got != cpAddr {
		t.Fatalf("bastion saw the connection from %v, want %v", got, cpAddr)
	}
	if at, ok := p.cp.LastHandshake(p.bastionKey.Public()); !ok || at.IsZero() {
		t.Fatalf("cp LastHandshake(bastion) = %v, %v; want a handshake", at, ok)
	}
	if at, ok := p.bastion.LastHandshake(p.cpKey.Public()); !ok || at.IsZero() {
		t.Fatalf("bastion LastHandshake(cp) = %v, %v; want a handshake", at, ok)
	}

	if err := p.cp.RemovePeer(p.bastionKey.Public()); err != nil {
		t.Fatal(err)
	}
	if _, ok := p.cp.LastHandshake(p.bastionKey.Public()); ok {
		t.Fatal("a removed peer still reports a handshake")
	}
	// The live connection was closed by RemovePeer itself: a read fails at
	// once, not by running into its deadline.
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("read on the removed peer's connection: %v; want it closed", err)
	}
	_, err = p.cp.DialContext(dialCtx(t, 5*time.Second), "tcp", "100.100.0.2:11434")
	wantRefused(t, err, ReasonDialTarget)
	// Underneath the package's own check: the device no longer routes to
	// the bastion at all, so a raw netstack dial gets no answer.
	raw, err := p.cp.tnet.DialContextTCPAddrPort(dialCtx(t, 2*time.Second), netip.MustParseAddrPort("100.100.0.2:11434"))
	if err == nil {
		raw.Close()
		t.Fatal("a raw dial reached the bastion after its peer was removed")
	}
}

// A peer whose allowed address is wider than one address is refused by Up
// before anything is created: no UDP socket (before and after), and no
// device ever existed (it would have logged, synchronously, binding its
// socket). A good peer listed first does not change that.
func TestUpRefusesWideAllowedIPAndOpensNothing(t *testing.T) {
	for _, wide := range []string{"100.100.0.0/24", "::/0", "0.0.0.0/0", "100.100.0.2/31", "fd00::/127"} {
		t.Run(wide, func(t *testing.T) {
			before := udpSockets(t)
			var logs logBuffer
			tun, err := Up(Config{
				PrivateKey: mustKey(t), Address: bastionAddr, Log: debugLogger(&logs),
				Peers: []Peer{
					{PublicKey: mustKey(t).Public(), AllowedIP: single(cpAddr)},
					{PublicKey: mustKey(t).Public(), AllowedIP: netip.MustParsePrefix(wide)},
				},
			})
			if tun != nil {
				tun.Close()
				t.Fatalf("Up brought a tunnel up with a peer allowed %s", wide)
			}
			wantRefused(t, err, ReasonWideAllowedIP)
			if after := udpSockets(t); !sameSet(before, after) {
				t.Fatalf("UDP sockets changed across a refused Up: before %v, after %v", before, after)
			}
			if strings.Contains(logs.String(), "wireguard device") {
				t.Fatalf("a device was created before the refusal:\n%s", logs.String())
			}
		})
	}
}

func TestUpRefusals(t *testing.T) {
	self := mustKey(t)
	peerKey := mustKey(t).Public()
	good := Peer{PublicKey: peerKey, AllowedIP: single(cpAddr)}
	cases := []struct {
		name   string
		mutate func(*Config)
		reason string
	}{
		{"no private key", func(c *Config) { c.PrivateKey = Key{} }, ReasonBadConfig},
		{"no address", func(c *Config) { c.Address = netip.Addr{} }, ReasonBadConfig},
		{"unspecified address", func(c *Config) { c.Address = netip.IPv4Unspecified() }, ReasonBadConfig},
		{"small MTU", func(c *Config) { c.MTU = 576 }, ReasonBadConfig},
		{"mapped listen address", func(c *Config) { c.ListenAddr = netip.MustParseAddr("::ffff:127.0.0.1") }, ReasonBadConfig},
		{"peer is our address", func(c *Config) { c.Peers[0].AllowedIP = single(bastionAddr) }, ReasonPeerIsSelf},
		{"peer is our key", func(c *Config) { c.Peers[0].PublicKey = self.Public() }, ReasonPeerIsSelf},
		{"duplicate key", func(c *Config) {
			c.Peers = append(c.Peers, Peer{PublicKey: peerKey, AllowedIP: single(netip.MustParseAddr("100.100.0.3"))})
		}, ReasonDuplicatePeer},
		{"address given twice", func(c *Config) {
			c.Peers = append(c.Peers, Peer{PublicKey: mustKey(t).Public(), AllowedIP: single(cpAddr)})
		}, ReasonAddressTaken},
		{"bad peer", func(c *Config) { c.Peers[0].Keepalive = -time.Second }, ReasonBadKeepalive},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{PrivateKey: self, Address: bastionAddr, Peers: []Peer{good}}
			tc.mutate(&cfg)
			tun, err := Up(cfg)
			if tun != nil {
				tun.Close()
			}
			wantRefused(t, err, tc.reason)
		})
	}
}

// AddPeer checks like Up, and never lets a second key take an address a
// peer holds; a refused AddPeer leaves the device and the live peer as
// they were.
func TestAddPeerRefusals(t *testing.T) {
	p := newPair(t, nil)
	ln, err := p.bastion.ListenTCP(11434)
	if err != nil {
		t.Fatal(err)
	}
	go serveEcho(ln, nil)
	intruder := mustKey(t).Public()
	wantRefused(t, p.cp.AddPeer(Peer{PublicKey: intruder, AllowedIP: netip.MustParsePrefix("100.100.0.0/24")}), ReasonWideAllowedIP)
	wantRefused(t, p.cp.AddPeer(Peer{PublicKey: intruder, AllowedIP: single(bastionAddr)}), ReasonAddressTaken)
	wantRefused(t, p.cp.AddPeer(Peer{PublicKey: intruder, AllowedIP: single(cpAddr)}), ReasonPeerIsSelf)
	st, err := readState(p.cp.dev)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := st.handshake[intruder]; ok || len(st.handshake) != 1 {
		t.Fatalf("device peers after refused AddPeer calls: %v", st.handshake)
	}
	c, err := p.cp.DialContext(dialCtx(t, 10*time.Second), "tcp", "100.100.0.2:11434")
	if err != nil {
		t.Fatalf("the paired bastion is unreachable after refused AddPeer calls: %v", err)
	}
	defer c.Close()
	echoOnce(t, c, []byte("still here"))
}

// Re-pairing: after the cp removes a bastion's peer, that address can go to
// a new key (a bastion that paired again with a new key), which is then
// reachable; the old key stays out.
func TestAddPeerAfterRemoveRepairs(t *testing.T) {
	p := newPair(t, nil)
	if err := p.cp.RemovePeer(p.bastionKey.Public()); err != nil {
		t.Fatal(err)
	}
	if err := p.cp.RemovePeer(p.bastionKey.Public()); err != nil {
		t.Fatalf("removing a removed peer: %v", err)
	}
	p.bastion.Close()
	newKey := mustKey(t)
	if err := p.cp.AddPeer(Peer{PublicKey: newKey.Public(), AllowedIP: single(bastionAddr)}); err != nil {
		t.Fatal(err)
	}
	b2, err := Up(Config{
		PrivateKey: newKey, Address: bastionAddr,
		Peers: []Peer{{PublicKey: p.cpKey.Public(), AllowedIP: single(cpAddr),
			Endpoint: netip.AddrPortFrom(loopback, p.cp.Port()), Keepalive: 25 * time.Second}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	ln, err := b2.ListenTCP(11434)
	if err != nil {
		t.Fatal(err)
	}
	go serveEcho(ln, nil)
	c, err := p.cp.DialContext(dialCtx(t, 20*time.Second), "tcp", "100.100.0.2:11434")
	if err != nil {
		t.Fatalf("dial after re-pairing: %v", err)
	}
	defer c.Close()
	echoOnce(t, c, []byte("back"))
	if _, ok := p.cp.LastHandshake(p.bastionKey.Public()); ok {
		t.Fatal("the old key has a handshake after re-pairing")
	}
}

func TestDialContextRefusesNonPeerTargets(t *testing.T) {
	p := newPair(t, nil)
	for _, tc := range []struct{ network, addr string }{
		{"udp", "100.100.0.2:11434"},
		{"tcp6", "100.100.0.2:11434"},
		{"tcp", "bastion.internal:11434"},
		{"tcp", "100.100.0.2"},
		{"tcp", "100.100.0.2:0"},
		{"tcp", "100.100.0.3:11434"},
		{"tcp", "100.100.0.1:11434"},
		{"tcp", "[::ffff:100.100.0.2]:11434"},
	} {
		_, err := p.cp.DialContext(dialCtx(t, time.Second), tc.network, tc.addr)
		wantRefused(t, err, ReasonDialTarget)
	}
}

// Close ends listeners (Accept returns) and connections, and releases the
// UDP socket(s); everything after it fails with net.ErrClosed.
func TestCloseReleasesEverything(t *testing.T) {
	before := udpSockets(t)
	p := newPair(t, nil)
	if n := len(udpSockets(t)) - len(before); n < 2 {
		t.Fatalf("two tunnels up added %d UDP sockets, want at least 2", n)
	}
	ln, err := p.bastion.ListenTCP(11434)
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan error, 1)
	go func() {
		_, err := ln.Accept()
		accepted <- err
	}()
	p.cp.Close()
	p.bastion.Close()
	select {
	case err := <-accepted:
		if err == nil {
			t.Fatal("Accept returned a connection after Close")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Accept still blocked 10 s after Close")
	}
	if after := udpSockets(t); !sameSet(before, after) {
		t.Fatalf("UDP sockets left after Close: before %v, after %v", before, after)
	}
	if _, err := p.cp.DialContext(dialCtx(t, time.Second), "tcp", "100.100.0.2:11434"); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("dial after Close: %v, want net.ErrClosed", err)
	}
	if err := p.cp.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// The cp end with ListenAddr 127.0.0.1 opens exactly one UDP socket, on
// that address; the bastion end (no ListenAddr) opens one port on every
// address (an IPv4 and, where there is IPv6, an IPv6 socket).
func TestListenAddrBindsOneAddress(t *testing.T) {
	before := udpSockets(t)
	p := newPair(t, nil)
	var cpSocks, bastionSocks []sockets.Socket
	for _, s := range udpSockets(t) {
		if containsSocket(before, s) {
			continue
		}
		switch s.Local.Port() {
		case p.cp.Port():
			cpSocks = append(cpSocks, s)
		case p.bastion.Port():
			bastionSocks = append(bastionSocks, s)
		default:
			t.Errorf("unexpected UDP socket %v", s)
		}
	}
	if len(cpSocks) != 1 || cpSocks[0].Local.Addr() != loopback {
		t.Fatalf("cp UDP sockets = %v, want one on 127.0.0.1:%d", cpSocks, p.cp.Port())
	}
	if len(bastionSocks) == 0 {
		t.Fatal("bastion has no UDP socket")
	}
	for _, s := range bastionSocks {
		if !s.Local.Addr().IsUnspecified() {
			t.Fatalf("bastion UDP socket %v is not on every address", s)
		}
	}
}

func udpSockets(t testing.TB) []sockets.Socket {
	t.Helper()
	all, err := sockets.ListeningSockets(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	var out []sockets.Socket
	for _, s := range all {
		if strings.HasPrefix(s.Proto, "udp") {
			out = append(out, s)
		}
	}
	return out
}

func containsSocket(ss []sockets.Socket, s sockets.Socket) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

func sameSet(a, b []sockets.Socket) bool {
	if len(a) != len(b) {
		return false
	}
	for _, s := range a {
		if !containsSocket(b, s) {
			return false
		}
	}
	return true
}

// isTimeout reports a deadline error, from the kernel's sockets or from the
// user-space stack's (which does not wrap os.ErrDeadlineExceeded).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
