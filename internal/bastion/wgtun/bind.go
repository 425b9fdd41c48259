package wgtun

import (
	"fmt"
	"net"
	"net/netip"
	"sync"

	"golang.zx2c4.com/wireguard/conn"
)

// addrBind is a conn.Bind with one UDP socket bound to one address.
//
// Why not conn.StdNetBind: it always listens on every address (":port", an
// IPv4 and an IPv6 socket) and offers no hook to change that, and the
// control plane in development and tests must listen on 127.0.0.1 only. This
// bind is deliberately plain: one socket, one datagram per call (BatchSize
// 1), no sticky source address (the socket has only one) and no fwmark. It
// is used only when Config.ListenAddr is set; the bastion side keeps
// StdNetBind.
type addrBind struct {
	addr netip.Addr

	mu sync.Mutex
	uc *net.UDPConn // nil while closed
}

var _ conn.Bind = (*addrBind)(nil)

func newAddrBind(addr netip.Addr) *addrBind {
	return &addrBind{addr: addr}
}

// Open binds addr:port (port 0: the system picks) and returns the one
// receive function.
func (b *addrBind) Open(port uint16) ([]conn.ReceiveFunc, uint16, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.uc != nil {
		return nil, 0, conn.ErrBindAlreadyOpen
	}
	network := "udp4"
	if b.addr.Is6() {
		network = "udp6"
	}
	uc, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(netip.AddrPortFrom(b.addr, port)))
	if err != nil {
		return nil, 0, fmt.Errorf("wgtun: binding UDP %s port %d: %w", b.addr, port, err)
	}
	b.uc = uc
	actual := uint16(uc.LocalAddr().(*net.UDPAddr).Port)
	return []conn.ReceiveFunc{receiveFrom(uc)}, actual, nil
}

// receiveFrom reads one datagram from uc; after uc is closed it returns an
// error wrapping net.ErrClosed, as conn.Bind requires.
func receiveFrom(uc *net.UDPConn) conn.ReceiveFunc {
	return func(bufs [][]byte, sizes []int, eps []conn.Endpoint) (int, error) {
		n, from, err := uc.ReadFromUDPAddrPort(bufs[0])
		if err != nil {
			return 0, err
		}
		sizes[0] = n
		eps[0] = &addrEndpoint{dst: netip.AddrPortFrom(from.Addr().Unmap(), from.Port())}
		return 1, nil
	}
}

// Close closes the socket; Open may be called again after it.
func (b *addrBind) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.uc == nil {
		return nil
	}
	err := b.uc.Close()
	b.uc = nil
	return err
}

// SetMark is a no-op: this bind sets no fwmark (the device asks only when
// one is configured, and we never configure one).
func (b *addrBind) SetMark(uint32) error { return nil }

// Send writes each buffer as one datagram to ep.
func (b *addrBind) Send(bufs [][]byte, ep conn.Endpoint) error {
	e, ok := ep.(*addrEndpoint)
	if !ok {
		return conn.ErrWrongEndpointType
	}
	b.mu.Lock()
	uc := b.uc
	b.mu.Unlock()
	if uc == nil {
		return net.ErrClosed
	}
	for _, buf := range bufs {
		if _, err := uc.WriteToUDPAddrPort(buf, e.dst); err != nil {
			return err
		}
	}
	return nil
}

// ParseEndpoint parses "addr:port" as the device's endpoint= line gives it.
func (b *addrBind) ParseEndpoint(s string) (conn.Endpoint, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return nil, fmt.Errorf("wgtun: endpoint: %w", err)
	}
	return &addrEndpoint{dst: netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())}, nil
}

// BatchSize is 1: one datagram per read and write.
func (b *addrBind) BatchSize() int { return 1 }

// addrEndpoint is a peer's UDP address for addrBind. It keeps no source
// address: the bind's socket has exactly one.
type addrEndpoint struct {
	dst netip.AddrPort
}

// The conn.Endpoint methods: only the destination is kept.

func (e *addrEndpoint) ClearSrc()           {}
func (e *addrEndpoint) SrcToString() string { return "" }
func (e *addrEndpoint) DstToString() string { return e.dst.String() }
func (e *addrEndpoint) DstIP() netip.Addr   { return e.dst.Addr() }
func (e *addrEndpoint) SrcIP() netip.Addr   { return netip.Addr{} }
func (e *addrEndpoint) DstToBytes() []byte {
	b, _ := e.dst.MarshalBinary()
	return b
}
