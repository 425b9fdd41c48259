package netguard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/textproto"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Proxy defaults. Header sizes, timeouts and connection counts are
// bounded so a client cannot hold the proxy's memory, goroutines or file
// descriptors for free.
const (
	DefaultTunnelIdleTimeout = 2 * time.Minute
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultMaxHeaderBytes    = 16 << 10
	DefaultProxyDialTimeout  = 15 * time.Second
	// DefaultKeepAliveTimeout closes a client connection idle between
	// requests.
	DefaultKeepAliveTimeout = 10 * time.Second
	// DefaultMaxConns bounds the client connections the proxy holds at
	// once over all its listeners; each costs at most two descriptors
	// (the client's and the upstream's).
	DefaultMaxConns = 1024
	// DefaultMaxConnsPerListener bounds the client connections one
	// listener (one sandbox's link) holds at once.
	DefaultMaxConnsPerListener = 64
)

// ReasonConnLimit is the reason a connection over a cap is refused with.
const ReasonConnLimit = "connection-limit"

// Verdicts as they appear in the proxy's log lines and metrics.
const (
	VerdictAllowed = "allowed"
	VerdictRefused = "refused"
	VerdictError   = "error"
)

// Reasons the proxy reports for requests that were not refused by a rule.
const (
	reasonNone           = "none"
	reasonBadRequest     = "bad-request"
	reasonDialFailed     = "dial-failed"
	reasonUpstreamFailed = "upstream-failed"
)

// logMessage is the constant message of the proxy's per-connection line.
const logMessage = "egress connection"

// ProxyConfig configures a Proxy.
type ProxyConfig struct {
	// Dialer checks and dials every target. Required.
	Dialer *Dialer
	// Logger receives one line per connection; nil discards.
	Logger *slog.Logger
	// Registerer receives the proxy's counters; nil keeps them on a private
	// registry (the global default registry is never used).
	Registerer prometheus.Registerer
	// TunnelIdleTimeout closes a CONNECT tunnel with no byte either way for
	// this long; 0 means DefaultTunnelIdleTimeout.
	TunnelIdleTimeout time.Duration
	// DialTimeout bounds resolving, checking and dialing a target; 0 means
	// DefaultProxyDialTimeout.
	DialTimeout time.Duration
	// MaxConns bounds the client connections held at once over every
	// listener; 0 means DefaultMaxConns.
	MaxConns int
	// MaxConnsPerListener bounds the client connections one Serve (one
	// listener) holds at once; 0 means DefaultMaxConnsPerListener.
	MaxConnsPerListener int
}

// Proxy is an egress proxy: HTTP CONNECT tunnels and absolute-form plain
// HTTP forwarding, every target dialed through a Dialer. A refused target
// gets 403 with a body naming only the reason code. It implements
// http.Handler; Server returns an http.Server with bounded header sizes and
// timeouts around it.
type Proxy struct {
	d         *Dialer
	log       *slog.Logger
	conns     *prometheus.CounterVec
	bytes     *prometheus.CounterVec
	transport *http.Transport
	idle      time.Duration
	dialTO    time.Duration
	total     chan struct{} // one token per client connection held
	perLn     int
}

// NewProxy builds a Proxy and registers its counters:
// bc_egress_connections_total{verdict,reason} and
// bc_egress_bytes_total{direction="up"|"down"}.
func NewProxy(cfg ProxyConfig) (*Proxy, error) {
	if cfg.Dialer == nil {
		return nil, errors.New("netguard: proxy needs a Dialer")
	}
	p := &Proxy{
		d:      cfg.Dialer,
		log:    cfg.Logger,
		idle:   cfg.TunnelIdleTimeout,
		dialTO: cfg.DialTimeout,
		conns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bc_egress_connections_total",
			Help: "Egress proxy connections and requests by verdict (allowed, refused, error) and reason code.",
		}, []string{"verdict", "reason"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "bc_egress_bytes_total",
			Help: "Bytes relayed by the egress proxy, up (client to target) and down (target to client).",
		}, []string{"direction"}),
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.idle <= 0 {
		p.idle = DefaultTunnelIdleTimeout
	}
	if p.dialTO <= 0 {
		p.dialTO = DefaultProxyDialTimeout
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	p.total = make(chan struct{}, cfg.MaxConns)
	p.perLn = cfg.MaxConnsPerListener
	if p.perLn <= 0 {
		p.perLn = DefaultMaxConnsPerListener
	}
	reg := cfg.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	for _, c := range []prometheus.Collector{p.conns, p.bytes} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("netguard: register proxy metrics: %w", err)
		}
	}
	p.transport = newTransport(cfg.Dialer)
	p.transport.DisableCompression = true // pass content encodings through untouched
	return p, nil
}

// Server returns an http.Server serving p with bounded request headers
// (DefaultMaxHeaderBytes) and header read timeout. It speaks HTTP/1.1 only.
func (p *Proxy) Server() *http.Server {
	return &http.Server{
		Handler:           p,
		ReadHeaderTimeout: DefaultReadHeaderTimeout,
		MaxHeaderBytes:    DefaultMaxHeaderBytes,
		IdleTimeout:       DefaultKeepAliveTimeout,
		ErrorLog:          slog.NewLogLogger(p.log.Handler(), slog.LevelWarn),
	}
}

// Serve serves the proxy on ln until ctx is done, then shuts the server
// down (tunnels already open run to their end or idle timeout). ln holds
// at most MaxConnsPerListener client connections at once, and the proxy
// MaxConns over all its listeners: a connection over either cap is
// answered 503 and closed at once.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	srv := p.Server()
	srv.BaseContext = func(net.Listener) context.Context { return ctx }
	errc := make(chan error, 1)
	lim := &limitListener{Listener: ln, p: p, ctx: ctx, per: make(chan struct{}, p.perLn)}
	go func() { errc <- srv.Serve(lim) }()
	select {
	case err := <-errc:
		return fmt.Errorf("netguard: proxy serve: %w", err)
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			return fmt.Errorf("netguard: proxy shutdown: %w", err)
		}
		<-errc // http.ErrServerClosed
		return nil
	}
}

// limitListener hands out a connection only while its listener's and the
// proxy's caps have room; it refuses the others itself.
type limitListener struct {
	net.Listener
	p   *Proxy
	ctx context.Context
	per chan struct{}
}

// Accept returns the next connection within the caps, refusing (503 and
// close) every one over them.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.per <- struct{}{}:
		default:
			l.refuse(c, "listener")
			continue
		}
		select {
		case l.p.total <- struct{}{}:
		default:
			<-l.per
			l.refuse(c, "proxy")
			continue
		}
		return &limitedConn{Conn: c, release: func() { <-l.p.total; <-l.per }}, nil
	}
}

// refuse counts a connection over a cap, answers it and closes it; the
// write has a short deadline so a client that never reads cannot hold it.
func (l *limitListener) refuse(c net.Conn, which string) {
	// Counted before the client is answered, so whoever sees the refusal
	// finds it counted.
	l.p.conns.WithLabelValues(VerdictRefused, ReasonConnLimit).Inc()
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = io.WriteString(c, "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 29\r\n\r\nrefused: too many connections")
	_ = c.Close()
	l.p.log.LogAttrs(l.ctx, slog.LevelWarn, logMessage,
		slog.String("client", c.RemoteAddr().String()),
		slog.String("verdict", VerdictRefused),
		slog.String("reason", ReasonConnLimit),
		slog.String("cap", which),
	)
}

// limitedConn gives its tokens back once, at its first Close.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

// Close closes the connection and releases its place under the caps.
func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// CloseWrite half-closes a TCP connection (tunnels relay a client's
// EOF); a connection that cannot half-close is closed.
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}

// ListenAndServe listens on addr and serves p until ctx is done.
func ListenAndServe(ctx context.Context, addr string, p *Proxy) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("netguard: proxy listen: %w", err)
	}
	return p.Serve(ctx, ln)
}

// record is what one connection's log line and counters report.
type record struct {
	client, method, target string
	verdict, reason        string
	addr                   string
	up, down               int64
}

func (p *Proxy) finish(ctx context.Context, rec record) {
	p.conns.WithLabelValues(rec.verdict, rec.reason).Inc()
	p.bytes.WithLabelValues("up").Add(float64(rec.up))
	p.bytes.WithLabelValues("down").Add(float64(rec.down))
	level := slog.LevelInfo
	if rec.verdict != VerdictAllowed {
		level = slog.LevelWarn
	}
	p.log.LogAttrs(ctx, level, logMessage,
		slog.String("client", rec.client),
		slog.String("method", rec.method),
		slog.String("target", rec.target),
		slog.String("verdict", rec.verdict),
		slog.String("reason", rec.reason),
		slog.String("addr", rec.addr),
		slog.Int64("bytes_up", rec.up),
		slog.Int64("bytes_down", rec.down),
	)
}

// deny answers the client and fills the record for a request that was not
// relayed. The body names only the reason code, and the connection is
// closed after the answer: a refused client does not keep a descriptor.
func (p *Proxy) deny(w http.ResponseWriter, rec *record, err error) {
	w.Header().Set("Connection", "close")
	var re *RefusedError
	switch {
	case errors.As(err, &re):
		rec.verdict, rec.reason = VerdictRefused, string(re.Reason)
		if re.Addr.IsValid() {
			rec.addr = re.Addr.String()
		}
		http.Error(w, "refused: "+string(re.Reason), http.StatusForbidden)
	case errors.Is(err, ErrBadTarget):
		rec.verdict, rec.reason = VerdictError, reasonBadRequest
		http.Error(w, "bad request: invalid target", http.StatusBadRequest)
	default:
		rec.verdict, rec.reason = VerdictError, reasonDialFailed
		http.Error(w, "bad gateway: could not reach target", http.StatusBadGateway)
	}
}

// ServeHTTP serves CONNECT tunnels and absolute-form http:// requests.
// Anything else (origin-form requests, https:// in absolute form) is
// answered 400.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec := record{client: r.RemoteAddr, method: r.Method}
	if r.Method == http.MethodConnect {
		p.serveConnect(w, r, &rec)
	} else {
		p.serveForward(w, r, &rec)
	}
	p.finish(r.Context(), rec)
}

func (p *Proxy) serveConnect(w http.ResponseWriter, r *http.Request, rec *record) {
	rec.target = r.RequestURI
	host, port, err := splitTarget(r.RequestURI, 0)
	if err != nil {
		p.deny(w, rec, err)
		return
	}
	rec.target = joinTarget(host, port)
	dctx, cancel := context.WithTimeout(r.Context(), p.dialTO)
	upstream, err := p.d.DialContext(dctx, "tcp", rec.target)
	cancel()
	if err != nil {
		p.deny(w, rec, err)
		return
	}
	defer upstream.Close()
	rec.verdict, rec.reason = VerdictAllowed, reasonNone
	if ra, ok := upstream.RemoteAddr().(*net.TCPAddr); ok {
		rec.addr = ra.IP.String()
	}
	client, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		rec.verdict, rec.reason = VerdictError, reasonUpstreamFailed
		http.Error(w, "proxy error", http.StatusInternalServerError)
		return
	}
	defer client.Close()
	_ = client.SetDeadline(time.Time{}) // drop the server's header deadlines
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection Established\r\n\r\n"); err != nil {
		rec.verdict, rec.reason = VerdictError, reasonUpstreamFailed
		return
	}
	// Bytes the client sent after its request headers (e.g. a TLS hello)
	// sit in the server's buffer: relay them first.
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		m, err := upstream.Write(b)
		rec.up += int64(m)
		if err != nil {
			return
		}
	}
	up, down := pipe(client, upstream, p.idle)
	rec.up += up
	rec.down = down
}

// pipe relays bytes both ways until both directions end, half-closing each
// side as its source ends. A tunnel with no byte either way for idle is
// closed.
func pipe(client, upstream net.Conn, idle time.Duration) (up, down int64) {
	act := newActivity()
	done := make(chan int64, 1)
	go func() {
		n, err := copyIdle(upstream, client, idle, act)
		finishDirection(upstream, client, err)
		done <- n
	}()
	down, err := copyIdle(client, upstream, idle, act)
	finishDirection(client, upstream, err)
	up = <-done
	return up, down
}

// finishDirection half-closes dst after a clean EOF from src; after an
// error it closes both so the other direction ends too.
func finishDirection(dst, src net.Conn, err error) {
	if err == nil {
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
			return
		}
	}
	_ = dst.Close()
	_ = src.Close()
}

// activity is the time of the last byte relayed in either direction.
type activity struct{ last chan time.Time }

func newActivity() *activity {
	a := &activity{last: make(chan time.Time, 1)}
	a.last <- time.Now()
	return a
}

func (a *activity) touch() {
	<-a.last
	a.last <- time.Now()
}

func (a *activity) since() time.Duration {
	t := <-a.last
	a.last <- t
	return time.Since(t)
}

// copyIdle copies src to dst until EOF (returning nil) or an error. A read
// that times out is retried while the other direction was active within
// idle, so a long one-way transfer is not cut.
func copyIdle(dst, src net.Conn, idle time.Duration, act *activity) (int64, error) {
	buf := make([]byte, 32<<10)
	var n int64
	for {
		_ = src.SetReadDeadline(time.Now().Add(idle))
		m, rerr := src.Read(buf)
		if m > 0 {
			act.touch()
			_ = dst.SetWriteDeadline(time.Now().Add(idle))
			w, werr := dst.Write(buf[:m])
			n += int64(w)
			if werr != nil {
				return n, werr
			}
		}
		if rerr != nil {
			if errors.Is(rerr, io.EOF) {
				return n, nil
			}
			var ne net.Error
			if errors.As(rerr, &ne) && ne.Timeout() && act.since() < idle {
				continue
			}
			return n, rerr
		}
	}
}

// hopHeaders are removed from forwarded requests and responses (RFC 9110
// section 7.6.1), Proxy-Authorization among them so a client's proxy
// credentials never reach the target.
var hopHeaders = []string{
	"Connection",
	"Proxy-Connection",
	"Keep-Alive",
	"Proxy-Authenticate",
	"Proxy-Authorization",
	"Te",
	"Trailer",
	"Transfer-Encoding",
	"Upgrade",
}

// removeHopByHop deletes hop-by-hop headers, including every header the
// Connection header names.
func removeHopByHop(h http.Header) {
	for _, v := range h.Values("Connection") {
		for f := range strings.SplitSeq(v, ",") {
			if f = textproto.TrimString(f); f != "" {
				h.Del(f)
			}
		}
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
}

// countingReader counts bytes read through it. The transport may still be
// reading a request body after RoundTrip returns, so the count is atomic.
type countingReader struct {
	r io.ReadCloser
	n atomic.Int64
}

// Read reads from the wrapped body and counts the bytes.
func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n.Add(int64(n))
	return n, err
}

// Close closes the wrapped body.
func (c *countingReader) Close() error { return c.r.Close() }

func (p *Proxy) serveForward(w http.ResponseWriter, r *http.Request, rec *record) {
	rec.target = r.RequestURI
	if !r.URL.IsAbs() || r.URL.Scheme != "http" || r.URL.Host == "" || r.URL.User != nil {
		p.deny(w, rec, badTarget("not an absolute-form http:// request"))
		return
	}
	host, port, err := splitTarget(r.URL.Host, 80)
	if err != nil {
		p.deny(w, rec, err)
		return
	}
	rec.target = joinTarget(host, port)
	out := r.Clone(r.Context())
	out.RequestURI = ""
	out.URL.Host = rec.target
	out.Host = r.URL.Host
	out.Close = false
	removeHopByHop(out.Header)
	var body *countingReader
	if r.Body != nil && r.Body != http.NoBody {
		body = &countingReader{r: r.Body}
		out.Body = body
	}
	resp, err := p.transport.RoundTrip(out)
	if body != nil {
		rec.up = body.n.Load()
	}
	if err != nil {
		p.deny(w, rec, err)
		return
	}
	defer resp.Body.Close()
	rec.verdict, rec.reason = VerdictAllowed, reasonNone
	removeHopByHop(resp.Header)
	for k, vs := range resp.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	n, err := io.Copy(w, resp.Body)
	rec.down = n
	if err != nil {
		rec.verdict, rec.reason = VerdictError, reasonUpstreamFailed
	}
}
