package previews_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
	"github.com/bettercompute/bettercompute/internal/sandboxes/previews"
	"github.com/bettercompute/bettercompute/internal/sandboxes/previewtoken"
	"github.com/bettercompute/bettercompute/internal/tickets"
	"github.com/bettercompute/bettercompute/internal/tunnels"
)

// countingListener counts the connections it accepts: the host's port
// stand-in, so a test sees whether a refused request reached it.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

// tcpStream is a real TCP connection to the stand-in port as the node
// stream the gateway would give.
type tcpStream struct {
	c    *net.TCPConn
	done chan struct{}
	once sync.Once
}

func (s *tcpStream) Recv() (tunnels.Chunk, error) {
	b := make([]byte, nodev1.MaxTunnelData)
	n, err := s.c.Read(b)
	if n > 0 {
		return tunnels.Chunk{Data: b[:n]}, nil
	}
	if errors.Is(err, io.EOF) {
		return tunnels.Chunk{EOF: true}, nil
	}
	return tunnels.Chunk{}, err
}
func (s *tcpStream) Send(p []byte) error { _, err := s.c.Write(p); return err }
func (s *tcpStream) CloseSend() error    { return s.c.CloseWrite() }
func (s *tcpStream) Resize(_, _ uint16) error {
	return nil
}
func (s *tcpStream) Close(string) {
	s.once.Do(func() { s.c.Close(); close(s.done) })
}
func (s *tcpStream) Done() <-chan struct{} { return s.done }

// opener is the gateway stand-in: it records the target and ticket
// action and connects to the stand-in port.
type opener struct {
	addr    string
	mu      sync.Mutex
	targets []tunnels.Target
}

func (o *opener) OpenTunnel(ctx context.Context, to tunnels.Target, _ *nodev1.SignedTicket) (tunnels.NodeStream, error) {
	o.mu.Lock()
	o.targets = append(o.targets, to)
	o.mu.Unlock()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", o.addr)
	if err != nil {
		return nil, err
	}
	return &tcpStream{c: c.(*net.TCPConn), done: make(chan struct{})}, nil
}

// signer signs nothing: it hands the body back (the gateway stand-in does
// not verify), recording what it was asked to sign.
type signer struct {
	mu     sync.Mutex
	bodies []*nodev1.TicketBody
}

func (s *signer) SignTicket(_ context.Context, b *nodev1.TicketBody) (*nodev1.SignedTicket, error) {
	s.mu.Lock()
	s.bodies = append(s.bodies, b)
	s.mu.Unlock()
	return &nodev1.SignedTicket{}, nil
}

// fakeSandboxes holds sandboxes by id, as the sandboxes module answers Get.
type fakeSandboxes map[string]sandboxes.Sandbox

func (f fakeSandboxes) Get(_ context.Context, scope iam.Scope, id string) (sandboxes.Sandbox, error) {
	x, ok := f[id]
	if !ok || !scope.Sees(x.TenantID) {
		return sandboxes.Sandbox{}, sandboxes.ErrNotFound
	}
	return x, nil
}

// GetSettled is Get: the sandboxes it holds have no pending claim.
func (f fakeSandboxes) GetSettled(ctx context.Context, scope iam.Scope, id string) (sandboxes.Sandbox, error) {
	return f.Get(ctx, scope, id)
}

// keySource is a fixed verifier.
type keySource struct{ v *previewtoken.Verifier }

func (k keySource) Verifier(context.Context) (*previewtoken.Verifier, error) { return k.v, nil }

// rig is a proxy in front of a real listener standing in for the
// sandbox's port.
type rig struct {
	proxy *httptest.Server
	port  *countingListener
	open  *opener
	sign  *signer
	key   previewtoken.Key
	clk   *clock.Fake
	sbx   fakeSandboxes
}

func newRig(t *testing.T, backend http.Handler) *rig {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: lis}
	srv := &http.Server{Handler: backend}
	go func() { _ = srv.Serve(cl) }()
	t.Cleanup(func() { srv.Close() })
	key, err := previewtoken.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	v, err := previewtoken.NewVerifier(key)
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	r := &rig{port: cl, open: &opener{addr: lis.Addr().String()}, sign: &signer{}, key: key, clk: clk,
		sbx: fakeSandboxes{
			"sb-one":  {ID: "sb-one", TenantID: "t-acme", NodeID: "n-1", State: sandboxes.StateRunning, ExpiresAt: clk.Now().Add(2 * time.Hour)},
			"sb-two":  {ID: "sb-two", TenantID: "t-acme", NodeID: "n-1", State: sandboxes.StateRunning, ExpiresAt: clk.Now().Add(2 * time.Hour)},
			"sb-gone": {ID: "sb-gone", TenantID: "t-acme", NodeID: "n-1", State: sandboxes.StateDeleted, ExpiresAt: clk.Now().Add(2 * time.Hour)},
			"sb-else": {ID: "sb-else", TenantID: "t-other", NodeID: "n-1", State: sandboxes.StateRunning, ExpiresAt: clk.Now().Add(2 * time.Hour)},
		}}
	p := previews.NewProxy(previews.ProxyDeps{Keys: keySource{v}, Sandboxes: r.sbx, Signer: r.sign, Opener: r.open, Clock: clk})
	r.proxy = httptest.NewServer(p)
	t.Cleanup(r.proxy.Close)
	return r
}

// url is a preview URL of sandbox and port signed by k for tenant,
// expiring in ttl.
func (r *rig) url(t *testing.T, k previewtoken.Key, sandbox, tenant string, port uint16, ttl time.Duration) string {
	t.Helper()
	tok, err := previewtoken.Issue(k, previewtoken.Claims{SandboxID: sandbox, Port: port, Expires: r.clk.Now().Add(ttl), TenantID: tenant}, r.clk.Now(), previews.MaxTTL)
	if err != nil {
		t.Fatal(err)
	}
	return previews.URL(r.proxy.URL, sandbox, port, tok)
}

func fetch(t *testing.T, method, url string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	cl := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

// TestPreviewProxyForwardsUnderThePrefix: a genuine preview URL reaches
// the port with the prefix stripped (query kept), over a stream whose
// ticket is for the preview action, the sandbox's node, the sandbox and
// the port; the caller's cookies and Referer never reach the sandbox, and
// the sandbox's Set-Cookie and Service-Worker-Allowed never reach the
// caller, who is told to send no Referer, and the page runs sandboxed in
// an opaque origin (Content-Security-Policy: sandbox, no
// allow-same-origin).
func TestPreviewProxyForwardsUnderThePrefix(t *testing.T) {
	var seen *http.Request
	r := newRig(t, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		seen = req
		w.Header().Set("Set-Cookie", "sid=1; Path=/")
		w.Header().Set("Service-Worker-Allowed", "/")
		_, _ = io.WriteString(w, "page at "+req.URL.RequestURI())
	}))
	u := r.url(t, r.key, "sb-one", "t-acme", 8080, time.Hour)
	res, body := fetch(t, "GET", u+"a/b%2Fc?x=1", map[string]string{"Cookie": "bc_session=secret", "Referer": u})
	if res.StatusCode != 200 || body != "page at /a/b%2Fc?x=1" {
		t.Fatalf("got %d %q", res.StatusCode, body)
	}
	if seen.Header.Get("Cookie") != "" || seen.Header.Get("Referer") != "" {
		t.Fatalf("the sandbox saw Cookie %q Referer %q", seen.Header.Get("Cookie"), seen.Header.Get("Referer"))
	}
	if res.Header.Get("Set-Cookie") != "" || res.Header.Get("Service-Worker-Allowed") != "" || res.Header.Get("Referrer-Policy") != "no-referrer" {
		t.Fatalf("answer headers %v", res.Header)
	}
	if csp := res.Header.Values("Content-Security-Policy"); len(csp) != 1 || csp[0] != previews.PageSandbox || strings.Contains(csp[0], "allow-same-origin") {
		t.Fatalf("the page is not confined to an opaque origin: Content-Security-Policy %q", csp)
	}
	want := tunnels.Target{NodeID: "n-1", Port: 8080, SandboxID: "sb-one", Action: tickets.ActionSandboxPreview}
	if len(r.open.targets) != 1 || r.open.targets[0] != want {
		t.Fatalf("streams opened %+v, want [%+v]", r.open.targets, want)
	}
	b := r.sign.bodies[0]
	if b.Action != tickets.ActionSandboxPreview || b.NodeId != "n-1" || b.SandboxId != "sb-one" || b.Port != 8080 || b.TenantId != "t-acme" || len(b.Argv) != 0 {
		t.Fatalf("ticket body %+v", b)
	}
	// The prefix without its slash redirects under it (relative links).
	res, _ = fetch(t, "GET", strings.TrimSuffix(u, "/"), nil)
	if res.StatusCode != http.StatusPermanentRedirect || !strings.HasSuffix(res.Header.Get("Location"), "/") {
		t.Fatalf("no-slash: %d %q", res.StatusCode, res.Header.Get("Location"))
	}
}

// TestPreviewProxyRefusesWithOne404AndReachesNoHost: a tampered, expired,
// other-sandbox, other-port, other-key or malformed token, and a deleted,
// missing or other-tenant sandbox, each answer the same 404 body, and no
// ticket is signed and no connection reaches the port.
func TestPreviewProxyRefusesWithOne404AndReachesNoHost(t *testing.T) {
	r := newRig(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "reached") }))
	other, err := previewtoken.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	good := r.url(t, r.key, "sb-one", "t-acme", 8080, time.Hour)
	tok := strings.Split(strings.TrimSuffix(good, "/"), "/")[6]
	sig := tok[strings.LastIndex(tok, ".")+1:]
	flipped := tok[:len(tok)-len(sig)] + string(sig[0]^1) + sig[1:]
	expired := r.url(t, r.key, "sb-one", "t-acme", 8080, time.Minute)
	for _, c := range []struct{ name, url string }{
		{"tampered", r.proxy.URL + previews.Prefix("sb-one", 8080, flipped) + "/"},
		{"other sandbox", r.proxy.URL + previews.Prefix("sb-two", 8080, tok) + "/"},
		{"other port", r.proxy.URL + previews.Prefix("sb-one", 8081, tok) + "/"},
		{"other key", r.url(t, other, "sb-one", "t-acme", 8080, time.Hour)},
		{"malformed", r.proxy.URL + "/p/sb-one/8080/v1.nope/"},
		{"port 0", r.proxy.URL + "/p/sb-one/0/" + tok + "/"},
		{"no prefix", r.proxy.URL + "/sb-one/8080/" + tok + "/"},
		{"deleted sandbox", r.url(t, r.key, "sb-gone", "t-acme", 8080, time.Hour)},
		{"missing sandbox", r.url(t, r.key, "sb-none", "t-acme", 8080, time.Hour)},
		{"another tenant's sandbox", r.url(t, r.key, "sb-else", "t-acme", 8080, time.Hour)},
	} {
		res, body := fetch(t, "GET", c.url, nil)
		if res.StatusCode != 404 || body != previews.NotFoundBody {
			t.Errorf("%s: %d %q", c.name, res.StatusCode, body)
		}
	}
	r.clk.Advance(time.Minute)
	if res, body := fetch(t, "GET", expired, nil); res.StatusCode != 404 || body != previews.NotFoundBody {
		t.Errorf("expired: %d %q", res.StatusCode, body)
	}
	if n := r.port.n.Load(); n != 0 || len(r.sign.bodies) != 0 || len(r.open.targets) != 0 {
		t.Fatalf("a refused request reached the host: %d connections, %d tickets, %d streams", n, len(r.sign.bodies), len(r.open.targets))
	}
	// The same rig forwards a genuine one (the refusals were not a dead
	// proxy).
	if res, body := fetch(t, "GET", good, nil); res.StatusCode != 200 || body != "reached" {
		t.Fatalf("genuine: %d %q", res.StatusCode, body)
	}
}

// TestPreviewProxyUpgradesWebSocket: a WebSocket upgrade passes through
// the proxy to the port (a real 101), and bytes then flow both ways.
func TestPreviewProxyUpgradesWebSocket(t *testing.T) {
	r := newRig(t, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Header.Get("Upgrade") != "websocket" || req.URL.Path != "/ws" {
			http.Error(w, "not an upgrade", 400)
			return
		}
		c, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		_ = rw.Flush()
		line, _ := rw.ReadString('\n')
		_, _ = rw.WriteString("echo " + line)
		_ = rw.Flush()
	}))
	u := r.url(t, r.key, "sb-one", "t-acme", 8080, time.Hour)
	path := strings.TrimPrefix(u, r.proxy.URL) + "ws"
	c, err := net.Dial("tcp", strings.TrimPrefix(r.proxy.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: preview\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusSwitchingProtocols || res.Header.Get("Upgrade") != "websocket" {
		t.Fatalf("upgrade answered %d %v", res.StatusCode, res.Header)
	}
	_, _ = io.WriteString(c, "ping\n")
	line, err := br.ReadString('\n')
	if err != nil || line != "echo ping\n" {
		t.Fatalf("through the upgrade: %q %v", line, err)
	}
}

// swapKeys is a key source whose current key a test replaces (a
// rotation).
type swapKeys struct {
	mu sync.Mutex
	v  *previewtoken.Verifier
}

func (k *swapKeys) Verifier(context.Context) (*previewtoken.Verifier, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.v, nil
}

// lockedSandboxes is a sandbox a test stops while the proxy reads it.
type lockedSandboxes struct {
	mu sync.Mutex
	x  sandboxes.Sandbox
}

func (l *lockedSandboxes) Get(_ context.Context, scope iam.Scope, id string) (sandboxes.Sandbox, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if id != l.x.ID || !scope.Sees(l.x.TenantID) {
		return sandboxes.Sandbox{}, sandboxes.ErrNotFound
	}
	return l.x, nil
}

// TestPreviewStreamEndsWithItsGrant: an open WebSocket through the proxy
// is checked again every RecheckEvery as a new request would be, and
// ends once its token no longer verifies (the preview key rotated, the
// token expired) or its sandbox stopped; until then it stays open.
func TestPreviewStreamEndsWithItsGrant(t *testing.T) {
	for _, c := range []string{"key rotated", "token expired", "sandbox stopped"} {
		t.Run(c, func(t *testing.T) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := &http.Server{Handler: http.HandlerFunc(echoUpgrade)}
			go func() { _ = srv.Serve(lis) }()
			t.Cleanup(func() { srv.Close() })
			key, _ := previewtoken.GenerateKey(rand.Reader)
			v, _ := previewtoken.NewVerifier(key)
			keys := &swapKeys{v: v}
			clk := clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
			sbx := &lockedSandboxes{x: sandboxes.Sandbox{ID: "sb-one", TenantID: "t-acme", NodeID: "n-1", State: sandboxes.StateRunning, ExpiresAt: clk.Now().Add(2 * time.Hour)}}
			p := previews.NewProxy(previews.ProxyDeps{Keys: keys, Sandboxes: sbx, Signer: &signer{}, Opener: &opener{addr: lis.Addr().String()}, Clock: clk})
			front := httptest.NewServer(p)
			t.Cleanup(front.Close)
			tok, err := previewtoken.Issue(key, previewtoken.Claims{SandboxID: "sb-one", Port: 8080, Expires: clk.Now().Add(time.Hour), TenantID: "t-acme"}, clk.Now(), previews.MaxTTL)
			if err != nil {
				t.Fatal(err)
			}
			conn, br := openWebSocket(t, front.URL, previews.Prefix("sb-one", 8080, tok)+"/ws")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			// The stream's guard waits on its ticker; a tick with nothing
			// changed leaves the stream open.
			if err := clk.BlockUntil(ctx, 1); err != nil {
				t.Fatal(err)
			}
			clk.Advance(previews.RecheckEvery)
			echo(t, conn, br, "still\n")
			switch c {
			case "key rotated":
				next, _ := previewtoken.GenerateKey(rand.Reader)
				nv, _ := previewtoken.NewVerifier(next)
				keys.mu.Lock()
				keys.v = nv
				keys.mu.Unlock()
				clk.Advance(previews.RecheckEvery)
			case "token expired":
				clk.Advance(time.Hour)
			case "sandbox stopped":
				sbx.mu.Lock()
				sbx.x.State = sandboxes.StateDeleted
				sbx.mu.Unlock()
				clk.Advance(previews.RecheckEvery)
			}
			// The proxy closes the caller's connection (the deadline only
			// bounds a failing test).
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
				t.Fatalf("the stream stayed open after %s: read %q, %v", c, rest, err)
			}
		})
	}
}

// echoUpgrade answers a WebSocket upgrade at /ws and echoes each line.
func echoUpgrade(w http.ResponseWriter, req *http.Request) {
	if req.Header.Get("Upgrade") != "websocket" || req.URL.Path != "/ws" {
		http.Error(w, "not an upgrade", 400)
		return
	}
	c, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer c.Close()
	_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	_ = rw.Flush()
	for {
		line, err := rw.ReadString('\n')
		if err != nil {
			return
		}
		_, _ = rw.WriteString("echo " + line)
		_ = rw.Flush()
	}
}

// openWebSocket upgrades path at the proxy base and checks the 101.
func openWebSocket(t *testing.T, base, path string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_, _ = io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: preview\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
	br := bufio.NewReader(c)
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", res, err)
	}
	return c, br
}

// echo sends line and wants it echoed.
func echo(t *testing.T, c net.Conn, br *bufio.Reader, line string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(c, line)
	got, err := br.ReadString('\n')
	if err != nil || got != "echo "+line {
		t.Fatalf("through the upgrade: %q %v", got, err)
	}
}
