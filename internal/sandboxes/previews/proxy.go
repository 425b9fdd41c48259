package previews

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
	"github.com/bettercompute/bettercompute/internal/sandboxes/previewtoken"
	"github.com/bettercompute/bettercompute/internal/tickets"
	"github.com/bettercompute/bettercompute/internal/tunnels"
)

// NotFoundBody is the body of every refused preview request, whatever the
// reason (the reason is logged, never answered).
const NotFoundBody = "404 page not found\n"

// ProxyCaller is the ticket body's caller of the proxy's tickets.
const ProxyCaller = "preview-proxy"

// VerifierSource returns the verifier of the current preview key (Keys).
type VerifierSource interface {
	Verifier(ctx context.Context) (*previewtoken.Verifier, error)
}

// ProxyDeps is what the proxy needs.
type ProxyDeps struct {
	Keys      VerifierSource
	Sandboxes Sandboxes
	// Signer signs the proxy's tickets (a worker key).
	Signer tunnels.Signer
	// Opener opens the stream through the node's session (the gateway of
	// this process), verifying and spending the ticket.
	Opener tunnels.Opener
	Clock  clock.Clock
	Log    *slog.Logger
}

// Proxy is the preview role's HTTP handler.
type Proxy struct {
	d  ProxyDeps
	rp *httputil.ReverseProxy
}

// target is where one verified request goes, and the token that let it
// (checked again while its stream stays open).
type target struct {
	nodeID, sandboxID, tenantID string
	port                        uint16
	token                       string
}

// RecheckEvery is how often a preview stream still open (a WebSocket, a
// long answer) is checked again as a new request would be: its token
// under the current preview key and clock, and its sandbox running. A
// rotated key, an expired token or a stopped sandbox ends the stream
// within this period, so no grant outlives what made it.
const RecheckEvery = 2 * time.Second

type targetKey struct{}

// NewProxy returns the preview proxy.
func NewProxy(d ProxyDeps) *Proxy {
	if d.Log == nil {
		d.Log = slog.Default()
	}
	p := &Proxy{d: d}
	p.rp = &httputil.ReverseProxy{
		Rewrite:        rewrite,
		Transport:      &http.Transport{DialContext: p.dial, DisableKeepAlives: true, MaxResponseHeaderBytes: 64 << 10, ForceAttemptHTTP2: false},
		ModifyResponse: scrubResponse,
		ErrorHandler:   p.proxyError,
	}
	return p
}

// ServeHTTP verifies a preview request and forwards it, or answers the
// constant 404.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	t, prefix, reason := p.admit(r)
	if reason != "" {
		p.d.Log.Info("preview refused", "reason", reason)
		notFound(w)
		return
	}
	if r.URL.Path == prefix {
		// The sandbox's root is under the prefix's slash, so relative
		// links resolve under it.
		http.Redirect(w, r, prefix+"/", http.StatusPermanentRedirect)
		return
	}
	ctx := context.WithValue(r.Context(), targetKey{}, t)
	p.rp.ServeHTTP(w, r.WithContext(ctx))
}

// admit parses and verifies a request's preview path and looks its
// sandbox up; it returns where it goes and its prefix, or why it is
// refused.
func (p *Proxy) admit(r *http.Request) (target, string, string) {
	sbx, port, token, ok := splitPath(r.URL.Path)
	if !ok {
		return target{}, "", "preview-path"
	}
	t, reason := p.check(r.Context(), sbx, port, token)
	if reason != "" {
		return target{}, "", reason
	}
	return t, Prefix(sbx, port, token), ""
}

// check verifies token for sandbox sbx and port under the current
// preview key and clock, and that its sandbox runs; it returns where the
// request goes, or why it is refused.
func (p *Proxy) check(ctx context.Context, sbx string, port uint16, token string) (target, string) {
	v, err := p.d.Keys.Verifier(ctx)
	if err != nil {
		p.d.Log.Warn("preview key unreadable", "err", err)
		return target{}, "preview-key-unavailable"
	}
	c, err := v.Verify(token, p.d.Clock.Now(), sbx, port)
	if err != nil {
		var re *previewtoken.RefusedError
		if errors.As(err, &re) {
			return target{}, string(re.Reason)
		}
		return target{}, "preview-refused"
	}
	x, err := p.d.Sandboxes.Get(ctx, iam.ScopeOf(c.TenantID), c.SandboxID)
	switch {
	case err != nil:
		return target{}, "preview-sandbox-unknown"
	case x.TenantID != c.TenantID:
		return target{}, "preview-sandbox-unknown"
	case x.State != sandboxes.StateRunning || !p.d.Clock.Now().Before(x.ExpiresAt):
		return target{}, "preview-sandbox-not-running"
	}
	return target{nodeID: x.NodeID, sandboxID: x.ID, tenantID: x.TenantID, port: port, token: token}, ""
}

// splitPath splits /p/<sandbox>/<port>/<token>[/…] into its parts.
func splitPath(path string) (sandboxID string, port uint16, token string, ok bool) {
	rest, found := strings.CutPrefix(path, "/p/")
	if !found {
		return "", 0, "", false
	}
	f := strings.SplitN(rest, "/", 4)
	if len(f) < 3 || f[0] == "" || f[2] == "" || len(f[0]) > previewtoken.MaxIDLen || len(f[2]) > previewtoken.MaxTokenLen {
		return "", 0, "", false
	}
	n, err := strconv.ParseUint(f[1], 10, 16)
	if err != nil || n == 0 || strconv.FormatUint(n, 10) != f[1] {
		return "", 0, "", false
	}
	return f[0], uint16(n), f[2], true
}

// rewrite strips the preview prefix and sends the request to the
// sandbox's port, without the caller's cookies.
func rewrite(pr *httputil.ProxyRequest) {
	t, _ := pr.In.Context().Value(targetKey{}).(target)
	sbx, port, token, _ := splitPath(pr.In.URL.Path)
	prefix := Prefix(sbx, port, token)
	out := pr.Out
	out.URL.Scheme, out.URL.Host = "http", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(t.port)))
	out.URL.Path = strings.TrimPrefix(pr.In.URL.Path, prefix)
	out.URL.RawPath = strings.TrimPrefix(pr.In.URL.EscapedPath(), prefix)
	if p, err := url.PathUnescape(out.URL.RawPath); err != nil || p != out.URL.Path {
		out.URL.RawPath = ""
	}
	out.Host = out.URL.Host
	out.Header.Del("Cookie")
	out.Header.Del("Referer") // it carries the token
}

// PageSandbox is the Content-Security-Policy every proxied answer
// carries (beside any the sandbox sends: a browser enforces both). Its
// sandbox directive without allow-same-origin runs the page in an opaque
// origin: every preview is served from the same host as the others (and,
// by default, as the API), and in an opaque origin a page's scripts can
// neither read nor set that host's cookies (the API's session cookie) nor
// share storage with another preview.
const PageSandbox = "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads"

// scrubResponse drops what would let one preview act on the shared
// origin beyond its own answers, confines the page to an opaque origin,
// and keeps the token out of Referers.
func scrubResponse(res *http.Response) error {
	res.Header.Del("Set-Cookie")
	res.Header.Del("Service-Worker-Allowed")
	res.Header.Add("Content-Security-Policy", PageSandbox)
	res.Header.Set("Referrer-Policy", "no-referrer")
	return nil
}

// proxyError answers a request whose stream could not be opened or
// failed.
func (p *Proxy) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	t, _ := r.Context().Value(targetKey{}).(target)
	p.d.Log.Info("preview stream failed", "sandbox_id", t.sandboxID, "port", t.port, "err", err)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Referrer-Policy", "no-referrer")
	w.WriteHeader(http.StatusBadGateway)
	_, _ = w.Write([]byte("502 the sandbox did not answer\n"))
}

// notFound writes the constant 404.
func notFound(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	w.WriteHeader(http.StatusNotFound)
	_, _ = w.Write([]byte(NotFoundBody))
}

// dial opens a stream to the request's sandbox port: a fresh ticket for
// the preview action, signed by a worker key, through the gateway, which
// verifies and spends it, to the node, which verifies it again.
func (p *Proxy) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	t, ok := ctx.Value(targetKey{}).(target)
	if !ok || t.nodeID == "" {
		return nil, errors.New("previews: a dial without a verified target")
	}
	now := p.d.Clock.Now()
	body := &nodev1.TicketBody{Jti: newJTI(), NodeId: t.nodeID, SandboxId: t.sandboxID, Port: uint32(t.port), Action: tickets.ActionSandboxPreview,
		TenantId: t.tenantID, Caller: ProxyCaller, IssuedAtMs: now.UnixMilli(), ExpiresAtMs: now.Add(tickets.Lifetime).UnixMilli()}
	st, err := p.d.Signer.SignTicket(ctx, body)
	if err != nil {
		return nil, err
	}
	ns, err := p.d.Opener.OpenTunnel(ctx, tunnels.Target{NodeID: t.nodeID, Port: uint32(t.port), SandboxID: t.sandboxID, Action: tickets.ActionSandboxPreview}, st)
	if err != nil {
		return nil, err
	}
	c := newStreamConn(ns)
	go p.guard(c, t)
	return c, nil
}

// guard checks an open stream again every RecheckEvery, as a new request
// would be checked, and ends it once that check refuses (or cannot be
// made: a preview key that cannot be read ends it too).
func (p *Proxy) guard(c *streamConn, t target) {
	tick := p.d.Clock.NewTicker(RecheckEvery)
	defer tick.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-tick.C():
		}
		ctx, cancel := context.WithTimeout(context.Background(), RecheckEvery)
		_, reason := p.check(ctx, t.sandboxID, t.port, t.token)
		cancel()
		if reason != "" {
			p.d.Log.Info("preview stream ended", "sandbox_id", t.sandboxID, "port", t.port, "reason", reason)
			_ = c.Close()
			return
		}
	}
}

// newJTI is 16 random bytes in hex.
func newJTI() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
