package wgtun

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun/netstack"
)

// WireGuard's cryptokey routing: a packet that arrives under the cp's key
// but carries a source address outside the cp's one allowed address never
// reaches anything on the bastion.
//
// The "cp" here holds the real cp key but runs a raw device whose network
// stack has two addresses, its own (100.100.0.1) and a foreign one
// (100.100.0.9). It sends a UDP datagram from the foreign address, then one
// from its own, to a UDP socket inside the bastion's tunnel. WireGuard keeps
// one peer's packets in order, so if the bastion's first datagram is the
// legitimate one, the foreign one was dropped (no sleep needed to show a
// non-arrival). UDP stands in for TCP because it lets the sender pick its
// source address; the filter sits below both, at the IP layer.
func TestCryptokeyRoutingDropsForeignSource(t *testing.T) {
	cpKey, bastionKey := mustKey(t), mustKey(t)
	foreign := netip.MustParseAddr("100.100.0.9")
	tdev, cpNet, err := netstack.CreateNetTUN([]netip.Addr{cpAddr, foreign}, nil, DefaultMTU)
	if err != nil {
		t.Fatal(err)
	}
	cpDev := device.NewDevice(tdev, newAddrBind(loopback), deviceLogger(slog.New(slog.DiscardHandler)))
	defer cpDev.Close()
	if err := cpDev.IpcSet("private_key=" + cpKey.hex() + "\nlisten_port=0\n"); err != nil {
		t.Fatal(err)
	}
	if err := cpDev.Up(); err != nil {
		t.Fatal(err)
	}
	st, err := readState(cpDev)
	if err != nil {
		t.Fatal(err)
	}
	bastion, err := Up(Config{PrivateKey: bastionKey, Address: bastionAddr, Peers: []Peer{{
		PublicKey: cpKey.Public(), AllowedIP: single(cpAddr), Endpoint: netip.AddrPortFrom(loopback, st.port),
	}}})
	if err != nil {
		t.Fatal(err)
	}
	defer bastion.Close()
	// The cp's device routes the bastion's address to the bastion.
	if err := cpDev.IpcSet(peerConfig(Peer{PublicKey: bastionKey.Public(), AllowedIP: single(bastionAddr),
		Endpoint: netip.AddrPortFrom(loopback, bastion.Port())})); err != nil {
		t.Fatal(err)
	}

	sink, err := bastion.tnet.ListenUDPAddrPort(netip.AddrPortFrom(bastionAddr, 7000))
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	dst := netip.AddrPortFrom(bastionAddr, 7000)
	for _, src := range []struct {
		from netip.AddrPort
		msg  string
	}{
		{netip.AddrPortFrom(foreign, 5000), "foreign"},
		{netip.AddrPortFrom(foreign, 5001), "foreign"},
		{netip.AddrPortFrom(cpAddr, 5002), "legit"},
	} {
		c, err := cpNet.DialUDPAddrPort(src.from, dst)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte(src.msg)); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	_ = sink.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 64)
	n, from, err := sink.ReadFrom(buf)
	if err != nil {
		t.Fatalf("no datagram reached the bastion: %v", err)
	}
	if got := string(buf[:n]); got != "legit" || !strings.HasPrefix(from.String(), cpAddr.String()+":") {
		t.Fatalf("first datagram inside the bastion: %q from %v; want \"legit\" from %v (the foreign source got through)", got, from, cpAddr)
	}
}

// A tunnel listener accepts only a current peer's address. The one source
// WireGuard does not filter is this process itself: the user-space stack
// delivers a dial to its own tunnel address locally. That connection is
// dropped and Accept returns the next, the peer's.
func TestListenerDropsNonPeerSource(t *testing.T) {
	var logs logBuffer
	p := newPair(t, debugLogger(&logs))
	ln, err := p.bastion.ListenTCP(11434)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	self, err := p.bastion.tnet.DialContextTCPAddrPort(dialCtx(t, 10*time.Second), netip.AddrPortFrom(bastionAddr, 11434))
	if err != nil {
		t.Fatalf("local dial: %v", err)
	}
	defer self.Close()
	dialed := make(chan net.Conn, 1)
	go func() {
		c, _ := p.cp.DialContext(context.Background(), "tcp", "100.100.0.2:11434")
		dialed <- c
	}()
	defer func() {
		if c := <-dialed; c != nil {
			c.Close()
		}
	}()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := remoteAddr(c); got != cpAddr {
		t.Fatalf("Accept returned a connection from %v, want only the peer %v", got, cpAddr)
	}
	_ = self.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := self.Read(make([]byte, 1)); err == nil {
		t.Fatal("the dropped local connection is still open")
	}
	if !strings.Contains(logs.String(), "reason="+ReasonForeignSource) {
		t.Fatalf("the refusal was not logged with its reason:\n%s", logs.String())
	}
}
