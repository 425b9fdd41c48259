package wgtun

import (
	"errors"
	"net"
	"testing"
)

// resetConn is a connection as gVisor hands one over after its peer reset
// it: both addresses read nil.
type resetConn struct {
	net.Conn
	closed bool
}

func (c *resetConn) RemoteAddr() net.Addr { return nil }
func (c *resetConn) LocalAddr() net.Addr  { return nil }
func (c *resetConn) Close() error         { c.closed = true; return nil }

// oneListener accepts conns in order, then answers net.ErrClosed.
type oneListener struct {
	net.Listener
	conns []net.Conn
}

func (l *oneListener) Accept() (net.Conn, error) {
	if len(l.conns) == 0 {
		return nil, net.ErrClosed
	}
	c := l.conns[0]
	l.conns = l.conns[1:]
	return c, nil
}

// TestAcceptClosesAConnectionResetBeforeAccept: a peer that resets its
// connection between the SYN and Accept leaves a connection with no
// address; Accept closes it and goes on (it used to dereference the nil
// address and crash the process).
func TestAcceptClosesAConnectionResetBeforeAccept(t *testing.T) {
	p := newPair(t, nil)
	rc := &resetConn{}
	l := &scopedListener{Listener: &oneListener{conns: []net.Conn{rc}}, t: p.cp}
	if c, err := l.Accept(); !errors.Is(err, net.ErrClosed) || c != nil {
		t.Fatalf("Accept = %v, %v; want the reset connection skipped, then net.ErrClosed", c, err)
	}
	if !rc.closed {
		t.Fatal("the reset connection was not closed")
	}
}

// TestTrackedConnKeepsItsAddresses: a tracked connection answers the
// addresses read when it was tracked even after the stack forgets them, so
// no caller that logs or checks them meets a nil address.
func TestTrackedConnKeepsItsAddresses(t *testing.T) {
	p := newPair(t, nil)
	remote := &net.TCPAddr{IP: bastionAddr.AsSlice(), Port: 40000}
	tc, ok := p.cp.track(&resetConn{}, remote)
	if !ok {
		t.Fatal("track refused the peer's address")
	}
	defer tc.Close()
	if got := tc.RemoteAddr(); got == nil || got.String() != "100.100.0.2:40000" {
		t.Fatalf("RemoteAddr = %v, want 100.100.0.2:40000", got)
	}
	if got := tc.LocalAddr(); got == nil || got.String() != "100.100.0.1:0" {
		t.Fatalf("LocalAddr = %v, want 100.100.0.1:0", got)
	}
}
