package netguard

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// chanHandler is an slog.Handler that hands each record to the test.
type chanHandler struct {
	ch chan slog.Record
}

func (h chanHandler) Enabled(context.Context, slog.Level) bool      { return true }
func (h chanHandler) Handle(_ context.Context, r slog.Record) error { h.ch <- r.Clone(); return nil }
func (h chanHandler) WithAttrs([]slog.Attr) slog.Handler            { return h }
func (h chanHandler) WithGroup(string) slog.Handler                 { return h }

func recordAttrs(r slog.Record) map[string]string {
	m := map[string]string{}
	r.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.String()
		return true
	})
	return m
}

type proxyFixture struct {
	addr string
	logs chan slog.Record
	reg  *prometheus.Registry
	p    *Proxy
}

// startProxy serves a Proxy on loopback. The proxy's Dialer allows
// 127.0.0.1 (so the tests' own upstream servers on loopback are reachable)
// and resolves names from res.
func startProxy(t *testing.T, res Resolver) *proxyFixture {
	t.Helper()
	d, err := NewDialer(Config{Resolver: res, Local: fakeLocal{}, Allow: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	f := &proxyFixture{logs: make(chan slog.Record, 16), reg: prometheus.NewRegistry()}
	f.p, err = NewProxy(ProxyConfig{Dialer: d, Logger: slog.New(chanHandler{f.logs}), Registerer: f.reg})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.p.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return f
}

// send writes a raw request to the proxy and returns the response and the
// connection (for tunnels).
func (f *proxyFixture) send(t *testing.T, raw string) (*http.Response, string, net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	method, _, _ := strings.Cut(raw, " ")
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatal(err)
	}
	var body string
	if !(method == http.MethodConnect && resp.StatusCode == http.StatusOK) {
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		body = string(b)
	}
	return resp, body, c, br
}

func (f *proxyFixture) nextLog(t *testing.T) map[string]string {
	t.Helper()
	r := <-f.logs
	if r.Message != logMessage {
		t.Fatalf("log message %q, want constant %q", r.Message, logMessage)
	}
	return recordAttrs(r)
}

// TestProxyConnectRefused403: a refused CONNECT is answered 403 with only
// the reason code, logged with verdict and reason, and counted.
func TestProxyConnectRefused403(t *testing.T) {
	f := startProxy(t, newFakeResolver(map[string][]string{"internal.example": {"10.0.0.1"}}))
	cases := []struct{ target, reason string }{
		{"internal.example:443", "private"},
		{"localhost:22", "localhost-name"},
		{"169.254.169.254:80", "link-local"},
		{"[fd00:ec2::254]:80", "ula"},
	}
	for _, tc := range cases {
		resp, body, _, _ := f.send(t, "CONNECT "+tc.target+" HTTP/1.1\r\nHost: "+tc.target+"\r\n\r\n")
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("CONNECT %s: status %d, want 403", tc.target, resp.StatusCode)
		}
		if body != "refused: "+tc.reason+"\n" {
			t.Fatalf("CONNECT %s: body %q, want only the reason code", tc.target, body)
		}
		l := f.nextLog(t)
		if l["verdict"] != "refused" || l["reason"] != tc.reason || l["bytes_up"] != "0" || l["bytes_down"] != "0" || l["client"] == "" {
			t.Fatalf("CONNECT %s: log %v", tc.target, l)
		}
	}
	// Each refused connection is counted once, under its own reason.
	for _, tc := range cases {
		if got := testutil.ToFloat64(f.p.conns.WithLabelValues("refused", tc.reason)); got != 1 {
			t.Fatalf("bc_egress_connections_total{refused,%s} = %v, want 1", tc.reason, got)
		}
	}
	if n, err := testutil.GatherAndCount(f.reg, "bc_egress_connections_total"); err != nil || n != len(cases) {
		t.Fatalf("bc_egress_connections_total has %d series (%v), want %d", n, err, len(cases))
	}
	// One line per connection: none is left over after the four read above.
	if n := len(f.logs); n != 0 {
		t.Fatalf("%d more log lines than connections", n)
	}
}

// echoServer accepts one connection on loopback and echoes it.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c)
	}()
	return ln.Addr().String()
}

// TestProxyConnectTunnelCountsBytes: an allowed CONNECT relays bytes both
// ways (including bytes the client sent right after its headers), and the
// log line and byte counters report them.
func TestProxyConnectTunnelCountsBytes(t *testing.T) {
	f := startProxy(t, newFakeResolver(nil))
	target := echoServer(t)
	resp, _, c, br := f.send(t, "CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\n\r\nearly")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if _, err := io.WriteString(c, "hello"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 10)
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "earlyhello" {
		t.Fatalf("echo %q, %v", buf, err)
	}
	_ = c.(*net.TCPConn).CloseWrite()
	if rest, _ := io.ReadAll(br); len(rest) != 0 {
		t.Fatalf("unexpected %q", rest)
	}
	l := f.nextLog(t)
	if l["verdict"] != "allowed" || l["reason"] != "none" || l["bytes_up"] != "10" || l["bytes_down"] != "10" || l["target"] != target {
		t.Fatalf("log %v", l)
	}
	if up := testutil.ToFloat64(f.p.bytes.WithLabelValues("up")); up != 10 {
		t.Fatalf("bc_egress_bytes_total{up} = %v", up)
	}
	if down := testutil.ToFloat64(f.p.bytes.WithLabelValues("down")); down != 10 {
		t.Fatalf("bc_egress_bytes_total{down} = %v", down)
	}
	if n := testutil.ToFloat64(f.p.conns.WithLabelValues("allowed", "none")); n != 1 {
		t.Fatalf("bc_egress_connections_total{allowed,none} = %v", n)
	}
}

// TestProxyForwardStripsHopByHop: plain HTTP forwarding removes hop-by-hop
// headers (those named by Connection included) and Proxy-Authorization,
// both ways, and passes the rest.
func TestProxyForwardStripsHopByHop(t *testing.T) {
	f := startProxy(t, newFakeResolver(nil))
	var mu sync.Mutex
	var seen http.Header
	var seenURI, seenHost string
	upstream := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen, seenURI, seenHost = r.Header.Clone(), r.RequestURI, r.Host
		mu.Unlock()
		w.Header().Set("Connection", "X-Hop-Resp")
		w.Header().Set("X-Hop-Resp", "1")
		w.Header().Set("Proxy-Authenticate", "Basic")
		w.Header().Set("X-End-Resp", "1")
		_, _ = io.WriteString(w, "payload")
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = upstream.Serve(ln) }()
	t.Cleanup(func() { _ = upstream.Close() })
	host := ln.Addr().String()
	body := "up-body"
	raw := "POST http://" + host + "/path?q=1 HTTP/1.1\r\nHost: " + host + "\r\n" +
		"Proxy-Authorization: Basic c2VjcmV0\r\nProxy-Connection: keep-alive\r\nConnection: X-Hop, keep-alive\r\n" +
		"X-Hop: 1\r\nKeep-Alive: timeout=5\r\nTe: trailers\r\nUpgrade: websocket\r\nX-End: 1\r\n" +
		"Content-Length: 7\r\n\r\n" + body
	resp, got, _, _ := f.send(t, raw)
	if resp.StatusCode != http.StatusOK || got != "payload" {
		t.Fatalf("status %d body %q", resp.StatusCode, got)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, h := range []string{"Proxy-Authorization", "Proxy-Connection", "Connection", "X-Hop", "Keep-Alive", "Te", "Upgrade"} {
		if v := seen.Get(h); v != "" {
			t.Errorf("upstream received %s: %q", h, v)
		}
	}
	if seen.Get("X-End") != "1" || seenURI != "/path?q=1" || seenHost != host {
		t.Errorf("upstream got X-End=%q uri=%q host=%q", seen.Get("X-End"), seenURI, seenHost)
	}
	for _, h := range []string{"X-Hop-Resp", "Proxy-Authenticate"} {
		if v := resp.Header.Get(h); v != "" {
			t.Errorf("client received %s: %q", h, v)
		}
	}
	if resp.Header.Get("X-End-Resp") != "1" {
		t.Errorf("client lost X-End-Resp")
	}
	l := f.nextLog(t)
	if l["verdict"] != "allowed" || l["bytes_up"] != "7" || l["bytes_down"] != "7" || l["method"] != "POST" {
		t.Fatalf("log %v", l)
	}
}

// TestProxyForwardRefused403: a refused absolute-form request gets 403
// with only the reason code; the address is not disclosed.
func TestProxyForwardRefused403(t *testing.T) {
	f := startProxy(t, newFakeResolver(map[string][]string{"metadata.example": {"169.254.169.254"}}))
	resp, body, _, _ := f.send(t, "GET http://metadata.example/latest/meta-data/ HTTP/1.1\r\nHost: metadata.example\r\n\r\n")
	if resp.StatusCode != http.StatusForbidden || body != "refused: link-local\n" {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	l := f.nextLog(t)
	if l["verdict"] != "refused" || l["reason"] != "link-local" || l["addr"] != "169.254.169.254" {
		t.Fatalf("log %v", l)
	}
}

// TestProxyRejectsMalformedRequests: origin-form, https absolute-form and
// bad targets get 400; oversized headers get 431.
func TestProxyRejectsMalformedRequests(t *testing.T) {
	f := startProxy(t, newFakeResolver(nil))
	for _, raw := range []string{
		"GET / HTTP/1.1\r\nHost: example.com\r\n\r\n",
		"GET https://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n",
		"CONNECT example.com HTTP/1.1\r\nHost: example.com\r\n\r\n",
		"CONNECT [fe80::1%25eth0]:443 HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET http://user:pw@example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n",
	} {
		resp, body, _, _ := f.send(t, raw)
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%q: status %d body %q, want 400", raw, resp.StatusCode, body)
			continue
		}
		if l := f.nextLog(t); l["verdict"] != "error" || l["reason"] != "bad-request" {
			t.Errorf("%q: log %v", raw, l)
		}
	}
	big := "GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\nX-Big: " + strings.Repeat("a", 32<<10) + "\r\n\r\n"
	resp, _, _, _ := f.send(t, big)
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("oversized headers: status %d, want 431", resp.StatusCode)
	}
}
