package forward

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"sync"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/netguard"
)

// Config configures one forward.
type Config struct {
	// Kind is which server the forward proxies to.
	Kind Kind
	// Upstream is the server's host:port (from Kind.EnvVar, else
	// Kind.DefaultAddr; "" means Kind.DefaultAddr). It may be a name.
	Upstream string
	// Policy returns the pairing's current policy; it is read at every
	// accept and every request, since grants change. A nil Policy refuses.
	Policy func() Policy
	// Streams is the pairing's stream cap, shared with its other lanes.
	Streams *Streams
	// Clock runs the idle watchdog; nil means the wall clock.
	Clock clock.Clock
	// Idle closes a stream with no byte either way for this long; 0
	// means DefaultIdle (10 minutes).
	Idle time.Duration
	// Audit receives every accept and refusal; nil drops them.
	Audit func(Event)
	// Local tells whether an address is this machine's; nil means
	// netguard.NewLocalChecker().
	Local netguard.LocalChecker
	// Resolver resolves a named upstream; nil means net.DefaultResolver.
	Resolver netguard.Resolver
	// Log receives operational logs; nil discards them.
	Log *slog.Logger
}

// Forward is one inference forward: a gated listener's server that
// filters each request and proxies it to the checked upstream.
type Forward struct {
	cfg   Config
	addrs []netip.AddrPort // the checked upstream addresses, dialled in order
	clk   clock.Clock
	idle  time.Duration
	local netguard.LocalChecker
	log   *slog.Logger
	proxy *httputil.ReverseProxy
}

// New checks cfg and the upstream (CheckUpstream) and returns the forward.
// It refuses to start when the upstream is not this machine; the error is
// then an *UpstreamError whose text says what to set.
func New(ctx context.Context, cfg Config) (*Forward, error) {
	if !cfg.Kind.valid() {
		return nil, fmt.Errorf("forward: unknown kind %q", cfg.Kind)
	}
	if cfg.Policy == nil || cfg.Streams == nil {
		return nil, errors.New("forward: config needs Policy and Streams")
	}
	if cfg.Upstream == "" {
		cfg.Upstream = cfg.Kind.DefaultAddr()
	}
	f := &Forward{cfg: cfg, clk: cfg.Clock, idle: cfg.Idle, local: cfg.Local, log: cfg.Log}
	if f.clk == nil {
		f.clk = clock.Real{}
	}
	if f.idle <= 0 {
		f.idle = DefaultIdle
	}
	if f.local == nil {
		f.local = netguard.NewLocalChecker()
	}
	if f.log == nil {
		f.log = slog.New(slog.DiscardHandler)
	}
	f.log = f.log.With("lane", cfg.Kind.Lane())
	var r netguard.Resolver = net.DefaultResolver
	if cfg.Resolver != nil {
		r = cfg.Resolver
	}
	addrs, err := CheckUpstream(ctx, cfg.Kind, cfg.Upstream, f.local, r)
	if err != nil {
		return nil, err
	}
	f.addrs = addrs
	f.proxy = f.newProxy()
	return f, nil
}

// Addrs returns the checked upstream addresses the forward dials.
func (f *Forward) Addrs() []netip.AddrPort { return append([]netip.AddrPort(nil), f.addrs...) }

// policy returns the current policy (nil refuses).
func (f *Forward) policy() Policy { return f.cfg.Policy() }

// audit reports ev to the audit sink.
func (f *Forward) audit(kind string, reason Reason, peer, detail string) {
	if f.cfg.Audit == nil {
		return
	}
	f.cfg.Audit(Event{Kind: kind, Lane: f.cfg.Kind.Lane(), Reason: string(reason), Peer: peer, Detail: detail})
}

// Serve accepts connections on ln until ctx ends or ln closes, then closes
// every connection it accepted and returns. A connection is admitted only
// while the policy allows "inference" and a stream slot is free; else it
// gets one refusal answer and is closed. It returns nil when ctx ended or
// ln was closed.
func (f *Forward) Serve(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s := &session{f: f, ln: ln, cl: newChanListener(ln.Addr()), refused: map[*idleConn]struct{}{}}
	srv := &http.Server{
		Handler:        f,
		BaseContext:    func(net.Listener) context.Context { return ctx },
		ErrorLog:       slog.NewLogLogger(f.log.Handler(), slog.LevelDebug),
		MaxHeaderBytes: maxHeaderBytes,
	}
	s.wg.Go(func() { _ = srv.Serve(s.cl) })
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	s.acceptLoop(ctx)
	cancel()
	_ = srv.Close()
	s.closeRefused()
	s.wg.Wait()
	return nil
}

// maxHeaderBytes caps a request's header block.
const maxHeaderBytes = 1 << 20

// session is one Serve call's state.
type session struct {
	f       *Forward
	ln      net.Listener
	cl      *chanListener
	wg      sync.WaitGroup
	mu      sync.Mutex
	refused map[*idleConn]struct{} // refused connections still answering
}

// acceptLoop accepts until ctx ends or the listener closes, backing off
// (on the injected clock) after other accept errors.
func (s *session) acceptLoop(ctx context.Context) {
	var delay time.Duration
	for {
		c, err := s.ln.Accept()
		if err == nil {
			delay = 0
			s.admit(c)
			continue
		}
		if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
			return
		}
		s.f.log.Warn("forward accept failed", "err", err)
		delay = min(max(2*delay, 5*time.Millisecond), time.Second)
		t := s.f.clk.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

// admit checks one accepted connection: the "inference" family, then a
// stream slot. An admitted connection goes to the HTTP server holding its
// slot; a refused one is answered once and closed.
func (s *session) admit(c net.Conn) {
	f := s.f
	peer := c.RemoteAddr().String()
	pol := f.policy()
	if pol == nil || !pol.Allows(FamilyInference) {
		s.refuseConn(c, peer, ReasonInferenceNotGranted)
		return
	}
	release, ok := f.cfg.Streams.Acquire()
	if !ok {
		s.refuseConn(c, peer, ReasonBusy)
		return
	}
	f.audit(EventAccept, "", peer, "")
	f.log.Debug("forward accepted", "peer", peer)
	ic := newIdleConn(c, f.clk, f.idle, release)
	if !s.cl.push(ic) {
		_ = ic.Close()
	}
}

// refuseConn audits the refusal and answers it on its own goroutine.
func (s *session) refuseConn(c net.Conn, peer string, reason Reason) {
	s.f.audit(EventRefuse, reason, peer, "at accept")
	s.f.log.Info("forward refused connection", "peer", peer, "reason", string(reason))
	ic := newIdleConn(c, s.f.clk, s.f.idle, nil)
	s.mu.Lock()
	s.refused[ic] = struct{}{}
	s.mu.Unlock()
	s.wg.Go(func() {
		defer func() {
			_ = ic.Close()
			s.mu.Lock()
			delete(s.refused, ic)
			s.mu.Unlock()
		}()
		s.f.answerRefused(ic, reason)
	})
}

// closeRefused closes the refused connections still being answered.
func (s *session) closeRefused() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ic := range s.refused {
		_ = ic.Close()
	}
}
