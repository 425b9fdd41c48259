package netguard

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// serveOn serves p on a fresh loopback listener (one sandbox link) and
// returns its address.
func serveOn(t *testing.T, p *Proxy) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return ln.Addr().String()
}

// dialHeld opens a client connection to addr and returns it; the test
// closes it.
func dialHeld(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// wantRefusedAndClosed reads what the proxy sends on c: a 503 naming the
// connection limit, then end of file (the proxy closed it).
func wantRefusedAndClosed(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second)) // a guard, not a synchronisation
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no refusal: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || string(body) != "refused: too many connections" {
		t.Fatalf("over the cap: %d %q", resp.StatusCode, body)
	}
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("the refused connection is not closed: %v", err)
	}
}

// connectOK opens a CONNECT tunnel to target through addr and checks it
// echoes.
func connectOK(t *testing.T, addr, target string) net.Conn {
	t.Helper()
	c := dialHeld(t, addr)
	if _, err := io.WriteString(c, "CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT through %s: %v %v", addr, resp, err)
	}
	return c
}

// TestProxyCapsConnections: one listener (one sandbox's link) holds at
// most MaxConnsPerListener connections and the proxy MaxConns over all;
// a connection over either cap is answered 503 and closed, counted
// refused/connection-limit; another listener still gets through while
// the first is full; and a closed connection frees its place.
func TestProxyCapsConnections(t *testing.T) {
	d, err := NewDialer(Config{Resolver: newFakeResolver(nil), Local: fakeLocal{}, Allow: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	p, err := NewProxy(ProxyConfig{Dialer: d, Registerer: reg, Logger: slog.New(slog.DiscardHandler), MaxConns: 5, MaxConnsPerListener: 3})
	if err != nil {
		t.Fatal(err)
	}
	a, b := serveOn(t, p), serveOn(t, p)
	var held []net.Conn
	for range 3 {
		held = append(held, dialHeld(t, a))
	}
	// The listener accepts in the order the connections were made: the
	// three held take a's places and the fourth is refused.
	wantRefusedAndClosed(t, dialHeld(t, a))
	// Another sandbox's link still gets through.
	connectOK(t, b, echoServer(t))
	held = append(held, dialHeld(t, b))
	// Five held over both listeners: the proxy's cap refuses the sixth
	// on b, whose own cap (3) has room.
	wantRefusedAndClosed(t, dialHeld(t, b))
	if n := testutil.ToFloat64(p.conns.WithLabelValues(VerdictRefused, ReasonConnLimit)); n != 2 {
		t.Fatalf("refused connection-limit counted %v, want 2", n)
	}
	// Closing one of a's connections frees a place: a new tunnel on a
	// gets through once the proxy has seen the close.
	_ = held[0].Close()
	target := echoServerN(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		c := dialHeld(t, a)
		_, _ = io.WriteString(c, "CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
		if err == nil && resp.StatusCode == http.StatusOK {
			break
		}
		_ = c.Close()
		if time.Now().After(deadline) {
			t.Fatalf("a closed connection never freed its place: %v %v", resp, err)
		}
	}
}

// echoServerN is echoServer serving any number of connections.
func echoServerN(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

// TestProxyClosesRefusedConnection: after a 403 the proxy closes the
// client's connection instead of keeping it for another request: a
// second request on it gets no answer, only the end of the connection.
func TestProxyClosesRefusedConnection(t *testing.T) {
	f := startProxy(t, newFakeResolver(nil))
	resp, _, c, br := f.send(t, "CONNECT 169.254.169.254:80 HTTP/1.1\r\nHost: 169.254.169.254:80\r\n\r\n")
	if resp.StatusCode != http.StatusForbidden || !resp.Close {
		t.Fatalf("status %d, close %v; want 403 and Connection: close", resp.StatusCode, resp.Close)
	}
	f.nextLog(t)
	_, _ = io.WriteString(c, "CONNECT 169.254.169.254:80 HTTP/1.1\r\nHost: 169.254.169.254:80\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second)) // a guard, not a synchronisation
	if r, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect}); err == nil {
		t.Fatalf("a second request on the refused connection was answered %d", r.StatusCode)
	} else if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the refused connection is not closed: %v", err)
	}
}
