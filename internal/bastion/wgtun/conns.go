package wgtun

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
)

// ListenTCP listens on port inside the tunnel, on Address(). Accept returns
// only connections from a current peer's allowed address; any other is
// closed and logged (ReasonForeignSource). WireGuard already drops packets
// whose source is not the sending peer's allowed address, so a foreign
// source here can only be this process dialling its own tunnel address; the
// check keeps the rule true whatever the stack underneath delivers.
func (t *Tunnel) ListenTCP(port uint16) (net.Listener, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, fmt.Errorf("wgtun: listen: %w", net.ErrClosed)
	}
	inner, err := t.tnet.ListenTCPAddrPort(netip.AddrPortFrom(t.addr, port))
	if err != nil {
		return nil, fmt.Errorf("wgtun: listening on tunnel port %d: %w", port, err)
	}
	l := &scopedListener{Listener: inner, t: t}
	t.listeners[l] = struct{}{}
	return l, nil
}

// DialContext connects inside the tunnel. network must be "tcp" (or "tcp4"
// or "tcp6" matching the address) and addr a literal "ip:port" whose
// address is a current peer's allowed address; anything else is refused
// with ReasonDialTarget before a packet is sent. No name is ever resolved.
func (t *Tunnel) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || ap.Port() == 0 {
		return nil, refuse(ReasonDialTarget, "dial address %q is not a literal address and port", addr)
	}
	switch {
	case network == "tcp", network == "tcp4" && ap.Addr().Is4(), network == "tcp6" && ap.Addr().Is6():
	default:
		return nil, refuse(ReasonDialTarget, "dial network %q for %s is not TCP of that address's family", network, ap)
	}
	t.mu.Lock()
	closed := t.closed
	_, isPeer := t.byAddr[ap.Addr()]
	t.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("wgtun: dial: %w", net.ErrClosed)
	}
	if !isPeer {
		return nil, refuse(ReasonDialTarget, "dial address %s is no peer's tunnel address", ap.Addr())
	}
	c, err := t.tnet.DialContextTCPAddrPort(ctx, ap)
	if err != nil {
		return nil, fmt.Errorf("wgtun: dialing %s in the tunnel: %w", ap, err)
	}
	tc, ok := t.track(c, net.TCPAddrFromAddrPort(ap))
	if !ok {
		_ = c.Close()
		return nil, refuse(ReasonDialTarget, "peer at %s was removed while dialling", ap.Addr())
	}
	return tc, nil
}

// scopedListener is a tunnel listener whose Accept drops connections from
// addresses that are no current peer's.
type scopedListener struct {
	net.Listener
	t *Tunnel
}

// Accept returns the next connection from a current peer.
func (l *scopedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		// gVisor answers a nil RemoteAddr once the connection is reset,
		// which a peer can do between its SYN and this Accept: such a
		// connection has no address to check and is closed.
		remote, ok := c.RemoteAddr().(*net.TCPAddr)
		if ok && remote != nil {
			if tc, ok := l.t.track(c, remote); ok {
				return tc, nil
			}
		}
		_ = c.Close()
		l.t.log.Info("tunnel connection refused", "reason", ReasonForeignSource, "remote", addrString(remote))
	}
}

// addrString is a's text, or "unknown" for a nil address.
func addrString(a *net.TCPAddr) string {
	if a == nil {
		return "unknown"
	}
	return a.String()
}

// Close stops the listener; the tunnel forgets it.
func (l *scopedListener) Close() error {
	l.t.mu.Lock()
	delete(l.t.listeners, l)
	l.t.mu.Unlock()
	return l.Listener.Close()
}

// trackedConn is a connection the tunnel carries for one peer address, so
// RemovePeer and Close can close it. Its addresses are the ones read when
// it was tracked: gVisor's own answer nil once the connection is reset,
// and every caller may log or check them at any time.
type trackedConn struct {
	net.Conn
	t      *Tunnel
	addr   netip.Addr
	remote *net.TCPAddr
	local  *net.TCPAddr
	once   sync.Once
}

// RemoteAddr is the peer's address and port (never nil).
func (c *trackedConn) RemoteAddr() net.Addr { return c.remote }

// LocalAddr is this end's tunnel address and port (never nil).
func (c *trackedConn) LocalAddr() net.Addr { return c.local }

// Close closes the connection and untracks it.
func (c *trackedConn) Close() error {
	c.once.Do(func() { c.t.untrack(c) })
	return c.Conn.Close()
}

// CloseWrite half-closes the connection (a FIN through the tunnel), so a
// relay can pass an end of input on while the answer still flows back.
func (c *trackedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}

// track records c, whose remote end is remote, as that peer address's,
// atomically with checking that the address is a current peer's and the
// tunnel is open. ok false: the caller closes c.
func (t *Tunnel) track(c net.Conn, remote *net.TCPAddr) (*trackedConn, bool) {
	addr := remote.AddrPort().Addr().Unmap()
	local, ok := c.LocalAddr().(*net.TCPAddr)
	if !ok || local == nil {
		local = &net.TCPAddr{IP: t.addr.AsSlice()}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, isPeer := t.byAddr[addr]; !isPeer || t.closed {
		return nil, false
	}
	tc := &trackedConn{Conn: c, t: t, addr: addr, remote: remote, local: local}
	set := t.conns[addr]
	if set == nil {
		set = map[*trackedConn]struct{}{}
		t.conns[addr] = set
	}
	set[tc] = struct{}{}
	return tc, true
}

func (t *Tunnel) untrack(c *trackedConn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if set := t.conns[c.addr]; set != nil {
		delete(set, c)
		if len(set) == 0 {
			delete(t.conns, c.addr)
		}
	}
}

// takeConnsLocked removes and returns addr's connections; t.mu is held.
func (t *Tunnel) takeConnsLocked(addr netip.Addr) []*trackedConn {
	set := t.conns[addr]
	delete(t.conns, addr)
	out := make([]*trackedConn, 0, len(set))
	for c := range set {
		out = append(out, c)
	}
	return out
}

// closeAll closes each connection (t.mu must not be held: Close untracks).
func closeAll(cs []*trackedConn) {
	for _, c := range cs {
		_ = c.Close()
	}
}
