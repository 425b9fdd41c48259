package forward

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
)

// DefaultIdle is how long a stream may pass no byte either way before it
// is closed.
const DefaultIdle = 10 * time.Minute

// idleConn is an accepted connection that is closed once no byte has been
// read or written for idle (on the injected clock), and that gives its
// stream slot back when it closes.
type idleConn struct {
	net.Conn
	clk     clock.Clock
	idle    time.Duration
	last    atomic.Int64 // clk.Now().UnixNano() of the last byte either way
	release func()
	once    sync.Once
	done    chan struct{}
}

// newIdleConn wraps c and starts its idle watchdog. release (may be nil)
// runs once, when the connection closes.
func newIdleConn(c net.Conn, clk clock.Clock, idle time.Duration, release func()) *idleConn {
	ic := &idleConn{Conn: c, clk: clk, idle: idle, release: release, done: make(chan struct{})}
	ic.touch()
	t := clk.NewTimer(idle)
	go ic.watch(t)
	return ic
}

func (c *idleConn) touch() { c.last.Store(c.clk.Now().UnixNano()) }

// watch closes the connection once it has been idle for c.idle. When the
// timer fires early (bytes moved since it was set) it is set again for
// the rest of the idle time.
func (c *idleConn) watch(t clock.Timer) {
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C():
		}
		quiet := c.clk.Now().Sub(time.Unix(0, c.last.Load()))
		if quiet >= c.idle {
			_ = c.Close()
			return
		}
		t.Reset(c.idle - quiet)
	}
}

// Read reads and counts a byte read as activity.
func (c *idleConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.touch()
	}
	return n, err
}

// Write writes and counts a byte written as activity.
func (c *idleConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if n > 0 {
		c.touch()
	}
	return n, err
}

// Close closes the connection, stops the watchdog and releases the slot.
func (c *idleConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		close(c.done)
		if c.release != nil {
			c.release()
		}
	})
	return err
}

// chanListener hands accepted, admitted connections to an http.Server.
type chanListener struct {
	addr   net.Addr
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newChanListener(addr net.Addr) *chanListener {
	return &chanListener{addr: addr, conns: make(chan net.Conn), closed: make(chan struct{})}
}

// Accept returns the next admitted connection, or net.ErrClosed.
func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

// push hands c to the server; false when the listener is closed.
func (l *chanListener) push(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.closed:
		return false
	}
}

// Close stops Accept.
func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

// Addr is the real listener's address.
func (l *chanListener) Addr() net.Addr { return l.addr }
