package previews

import (
	"io"
	"net"
	"sync"
	"time"

	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/tunnels"
)

// streamConn is a node stream as a net.Conn, for the proxy's HTTP
// transport: reads give what the sandbox's port sends, writes go to it,
// CloseWrite half-closes, Close ends the stream. Deadlines are not
// supported (the transport sets none; the stream ends with the node's
// session or the sandbox, or when the proxy's guard ends it).
type streamConn struct {
	ns   tunnels.NodeStream
	done chan struct{} // closed by Close

	rmu sync.Mutex
	buf []byte
	eof bool

	wmu  sync.Mutex
	once sync.Once
}

func newStreamConn(ns tunnels.NodeStream) *streamConn {
	return &streamConn{ns: ns, done: make(chan struct{})}
}

// Read returns the sandbox's bytes; io.EOF once it closed its side or the
// stream ended.
func (c *streamConn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for len(c.buf) == 0 {
		if c.eof {
			return 0, io.EOF
		}
		ch, err := c.ns.Recv()
		switch {
		case err != nil, ch.EOF, ch.Exit != nil:
			c.eof = true
		default:
			c.buf = ch.Data
		}
	}
	n := copy(p, c.buf)
	c.buf = c.buf[n:]
	return n, nil
}

// Write sends p to the sandbox in frames of at most nodev1.MaxTunnelData.
func (c *streamConn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	n := 0
	for len(p) > 0 {
		k := min(len(p), nodev1.MaxTunnelData)
		if err := c.ns.Send(p[:k]); err != nil {
			return n, err
		}
		n, p = n+k, p[k:]
	}
	return n, nil
}

// CloseWrite tells the sandbox nothing more is sent.
func (c *streamConn) CloseWrite() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.ns.CloseSend()
}

// Close ends the stream.
func (c *streamConn) Close() error {
	c.once.Do(func() { c.ns.Close("closed"); close(c.done) })
	return nil
}

// LocalAddr is the stream's (placeholder) address.
func (c *streamConn) LocalAddr() net.Addr { return streamAddr{} }

// RemoteAddr is the stream's (placeholder) address.
func (c *streamConn) RemoteAddr() net.Addr { return streamAddr{} }

// SetDeadline does nothing: see streamConn.
func (c *streamConn) SetDeadline(time.Time) error { return nil }

// SetReadDeadline does nothing: see streamConn.
func (c *streamConn) SetReadDeadline(time.Time) error { return nil }

// SetWriteDeadline does nothing: see streamConn.
func (c *streamConn) SetWriteDeadline(time.Time) error { return nil }

// streamAddr is a stream's address.
type streamAddr struct{}

// Network names the stream's kind.
func (streamAddr) Network() string { return "bc-preview" }

// String names the stream.
func (streamAddr) String() string { return "sandbox-preview" }
