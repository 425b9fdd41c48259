package daemon_test

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"io"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// This file holds the servers the join tests put in front of a node: a
// gateway impostor, a TCP relay that sends each connection where the test
// says, and TLS credentials that watch what crosses a connection.

// watchedCreds wraps server TLS credentials: it counts completed
// handshakes and the application bytes read after them, and, when
// cutAfterFirstResponse is set, closes a connection right after the
// server wrote the trailers of its first RPC (an on-path attacker that
// drops the connection as soon as the answer went through).
type watchedCreds struct {
	credentials.TransportCredentials
	cutAfterFirstResponse bool
	handshakes            atomic.Int64
	bytesRead             atomic.Int64
}

func (w *watchedCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	c, ai, err := w.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		return nil, nil, err
	}
	w.handshakes.Add(1)
	return &watchedConn{Conn: c, creds: w}, ai, nil
}

func (w *watchedCreds) Clone() credentials.TransportCredentials {
	return &watchedCreds{TransportCredentials: w.TransportCredentials.Clone(), cutAfterFirstResponse: w.cutAfterFirstResponse}
}

// watchedConn is the plaintext side of a server connection (HTTP/2
// frames). It parses the frame headers the server writes to find the end
// of the first response: a HEADERS frame with END_STREAM.
type watchedConn struct {
	net.Conn
	creds *watchedCreds

	mu      sync.Mutex
	hdr     []byte // a partial frame header
	skip    int    // payload bytes of the current frame still to pass
	cut     bool
	cutOnce sync.Once
}

func (c *watchedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.creds.bytesRead.Add(int64(n))
	return n, err
}

func (c *watchedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if !c.creds.cutAfterFirstResponse {
		return n, err
	}
	c.mu.Lock()
	for b := p[:n]; len(b) > 0; {
		if c.skip > 0 {
			k := min(c.skip, len(b))
			c.skip -= k
			b = b[k:]
			continue
		}
		k := min(9-len(c.hdr), len(b))
		c.hdr = append(c.hdr, b[:k]...)
		b = b[k:]
		if len(c.hdr) < 9 {
			break
		}
		length := int(c.hdr[0])<<16 | int(c.hdr[1])<<8 | int(c.hdr[2])
		typ, flags := c.hdr[3], c.hdr[4]
		stream := binary.BigEndian.Uint32(c.hdr[5:9]) & 0x7fffffff
		const framHeaders, flagEndStream = 0x1, 0x1
		if typ == framHeaders && flags&flagEndStream != 0 && stream != 0 {
			c.cut = true
		}
		c.hdr, c.skip = c.hdr[:0], length
	}
	cut := c.cut
	c.mu.Unlock()
	if cut {
		c.cutOnce.Do(func() { _ = c.Conn.Close() })
	}
	return n, err
}

// impostor is a Gateway server that answers Bundle with the real signed
// bundle (anyone can fetch it) and records every token it is sent.
type impostor struct {
	nodev1.UnimplementedGatewayServer
	bundle *nodev1.SignedTrustBundle
	tokens chan string
}

func (i *impostor) Bundle(context.Context, *nodev1.BundleRequest) (*nodev1.SignedTrustBundle, error) {
	return i.bundle, nil
}

func (i *impostor) Join(_ context.Context, req *nodev1.JoinRequest) (*nodev1.JoinResponse, error) {
	select {
	case i.tokens <- req.Token:
	default:
	}
	return nil, status.Error(codes.Unavailable, "stolen")
}

// serve runs impl on a loopback listener with cert, behind watched
// credentials, and returns its address and the credentials.
func serve(t *testing.T, cfg *tls.Config, impl nodev1.GatewayServer, cut bool) (string, *watchedCreds) {
	t.Helper()
	creds := &watchedCreds{TransportCredentials: credentials.NewTLS(cfg), cutAfterFirstResponse: cut}
	s := grpc.NewServer(grpc.Creds(creds))
	nodev1.RegisterGatewayServer(s, impl)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return lis.Addr().String(), creds
}

// newImpostor serves an impostor with cert and returns its address, its
// credentials and the impostor.
func newImpostor(t *testing.T, e *testenv.Env, cert tls.Certificate) (string, *watchedCreds, *impostor) {
	t.Helper()
	b, err := e.CP.Gateway.Bundle(context.Background(), &nodev1.BundleRequest{})
	if err != nil {
		t.Fatal(err)
	}
	imp := &impostor{bundle: b, tokens: make(chan string, 8)}
	addr, creds := serve(t, &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}}, imp, false)
	return addr, creds, imp
}

// gatewayCert issues a gateway server certificate for 127.0.0.1 under the
// internal CA of bundle b (sealed under kek), naming trust domain td.
func gatewayCert(t *testing.T, b *pki.Bundle, kek pki.KEK, td string) tls.Certificate {
	t.Helper()
	key, err := b.InternalCAKey(kek)
	if err != nil {
		t.Fatal(err)
	}
	c, err := pki.IssueServerCert(b.InternalCA, key, td, []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// foreignPKI makes another deployment's PKI for the same trust domain.
func foreignPKI(t *testing.T, td string) (*pki.Bundle, pki.KEK) {
	t.Helper()
	kek, err := pki.CreateKEK(filepath.Join(t.TempDir(), "kek"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := pki.Init(filepath.Join(t.TempDir(), "pki"), td, kek, clock.NewFake(time.Now().Add(-time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	return b, kek
}

// relay is an on-path attacker at the TCP level: it accepts connections
// and sends the i-th one (from 0) to route(i), copying bytes both ways.
type relay struct {
	lis   net.Listener
	count atomic.Int64
}

func startRelay(t *testing.T, route func(i int64) string) *relay {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{lis: lis}
	var wg sync.WaitGroup
	var conns sync.Map
	t.Cleanup(func() {
		lis.Close()
		conns.Range(func(k, _ any) bool { k.(net.Conn).Close(); return true })
		wg.Wait()
	})
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			i := r.count.Add(1) - 1
			up, err := net.Dial("tcp", route(i))
			if err != nil {
				c.Close()
				continue
			}
			conns.Store(c, true)
			conns.Store(up, true)
			wg.Add(2)
			pipe := func(dst, src net.Conn) {
				defer wg.Done()
				_, _ = io.Copy(dst, src)
				dst.Close()
				src.Close()
			}
			go pipe(up, c)
			go pipe(c, up)
		}
	}()
	return r
}

func (r *relay) addr() string { return r.lis.Addr().String() }

// noToken fails the test if imp was sent a token.
func noToken(t *testing.T, imp *impostor) {
	t.Helper()
	select {
	case tok := <-imp.tokens:
		if tok != "" {
			t.Fatal("the impostor received the join token")
		}
		t.Fatal("the impostor received a Join")
	default:
	}
}
