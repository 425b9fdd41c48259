// Package hosthelper is the root helper's server (bcd helper): it serves
// the unprivileged node agent, over a Unix socket, the few typed operations
// that need root, and nothing else. Every connection is checked before a
// byte of it is parsed (the caller's kernel-reported uid and gid must be
// the node account's or root's, its executable an installed bcd), every
// request is decoded strictly and bounded, every operation that changes
// the host must first pass the injected desired-state check (no check
// configured: refused, fail closed), and every operation and refusal is
// logged and kept for the node to drain as audit events. The wire shapes
// are package helperwire; the operations themselves are registered by the
// command that runs the helper.
package hosthelper

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
)

// Defaults for Config's bounds.
const (
	DefaultReadTimeout = 30 * time.Second
	DefaultMaxEvents   = 1024
	DefaultMaxConns    = 32
)

// Caller is the process at the other end of a connection, as the kernel
// reported it (SO_PEERCRED) at connect time.
type Caller struct {
	PID      int32
	UID, GID uint32
}

// Handler runs one operation for an allowed caller and a strictly decoded
// request. A *helperwire.Refusal error is answered with its code; any other
// error is answered CodeFailed with a generic reason (the error goes to the
// helper's log only, so no detail leaks to the caller). ctx is cancelled
// when the server stops.
type Handler func(ctx context.Context, c Caller, req *helperwire.Request) (json.RawMessage, error)

// Config is the helper's configuration.
type Config struct {
	// NodeUID and NodeGID are the node account's: a caller's uid must be
	// NodeUID or 0 and its gid NodeGID or 0.
	NodeUID, NodeGID uint32
	// ExeSHA256 pins executables accepted as bcd besides the helper's own.
	ExeSHA256 [][sha256.Size]byte
	// Intent checks a host-changing request's signed desired state. When
	// nil, every host-changing operation is refused CodeIntentMissing.
	Intent func(req *helperwire.Request) error
	// Log receives one record per operation done or refused (default: discard).
	Log *slog.Logger
	// Clock stamps events (default: the wall clock).
	Clock clock.Clock
	// ReadTimeout bounds how long a caller may take to send its request and
	// to read the answer (default DefaultReadTimeout).
	ReadTimeout time.Duration
	// MaxEvents bounds the undrained events kept (default DefaultMaxEvents).
	MaxEvents int
	// MaxConns bounds the connections served at once (default DefaultMaxConns).
	MaxConns int
	// SelfExe is the executable callers are compared with (default
	// /proc/self/exe, the very file the helper runs).
	SelfExe string
}

// Server is the root helper. Register operations with Handle, then Serve.
type Server struct {
	cfg Config
	exe *exeCheck

	mu     sync.Mutex
	routes map[string]route
	events []helperwire.Event
	drops  int
}

type route struct {
	h           Handler
	changesHost bool
}

// New makes a Server serving ping and events.drain; more operations are
// added with Handle.
func New(cfg Config) (*Server, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = DefaultReadTimeout
	}
	if cfg.MaxEvents <= 0 {
		cfg.MaxEvents = DefaultMaxEvents
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.SelfExe == "" {
		cfg.SelfExe = "/proc/self/exe"
	}
	exe, err := newExeCheck(cfg.SelfExe, cfg.ExeSHA256)
	if err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, exe: exe, routes: map[string]route{}}, nil
}

// Handle registers h for op. changesHost marks an operation that changes
// the host: the server runs Config.Intent on its request first and refuses
// it when that fails or when there is no Intent. It panics on an op outside
// the wire contract, a built-in op or a second registration, which are
// programming errors.
func (s *Server) Handle(op string, h Handler, changesHost bool) {
	if !knownOp(op) || op == helperwire.OpPing || op == helperwire.OpEventsDrain || h == nil {
		panic("hosthelper: cannot register operation " + op)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.routes[op]; dup {
		panic("hosthelper: operation registered twice: " + op)
	}
	s.routes[op] = route{h: h, changesHost: changesHost}
}

// Serve accepts connections on l until ctx is done, then closes l, cancels
// the handlers' contexts and returns once every connection is finished.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait() // runs after cancel (defers run last in, first out)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	// Closed (its socket file removed) before Serve returns, not only by
	// the AfterFunc's goroutine, which may run later.
	defer l.Close()
	slots := make(chan struct{}, s.cfg.MaxConns)
	for {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		c, err := l.Accept()
		if err != nil {
			<-slots
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("helper: accept: %w", err)
		}
		wg.Go(func() {
			defer func() { <-slots }()
			s.serveConn(ctx, c)
		})
	}
}

// serveConn answers one connection: caller checks, one request, one answer.
func (s *Server) serveConn(ctx context.Context, c net.Conn) {
	defer c.Close()
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return
	}
	_ = uc.SetDeadline(time.Now().Add(s.cfg.ReadTimeout))
	p, err := peerOf(uc)
	if err != nil {
		s.cfg.Log.Warn("helper could not read peer credentials", "err", err)
		return
	}
	defer p.close()
	ref := s.checkUID(p.Caller)
	if ref == nil {
		ref = s.exe.allowed(p) // before any byte of the request is read
	}
	var body []byte
	if ref == nil {
		body, ref = readRequest(uc)
	}
	if ref == nil {
		ref = s.exe.allowed(p) // again: the caller may have exec'd meanwhile
	}
	var req *helperwire.Request
	if ref == nil {
		req, ref = Decode(body)
	}
	op, result := "", json.RawMessage(nil)
	if ref == nil {
		op = req.Op
		_ = uc.SetDeadline(time.Time{}) // the operation's own time is its ctx's
		result, ref = s.dispatch(ctx, p.Caller, req)
	}
	s.answer(uc, p.Caller, op, result, ref)
}

// checkUID is the first check: the kernel-reported uid and gid.
func (s *Server) checkUID(c Caller) *helperwire.Refusal {
	if (c.UID == s.cfg.NodeUID || c.UID == 0) && (c.GID == s.cfg.NodeGID || c.GID == 0) {
		return nil
	}
	return refuse(helperwire.CodePeerUID, "caller is not the node account")
}

// readRequest reads until the caller shuts its write half, at most
// MaxRequest+1 bytes.
func readRequest(c *net.UnixConn) ([]byte, *helperwire.Refusal) {
	b, err := io.ReadAll(io.LimitReader(c, helperwire.MaxRequest+1))
	if len(b) > helperwire.MaxRequest {
		return nil, refuse(helperwire.CodeTooLarge, "request over 4 MiB")
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return nil, refuse(helperwire.CodeMalformed, "request not received in time")
	}
	if err != nil {
		return nil, refuse(helperwire.CodeMalformed, "request not received")
	}
	return b, nil
}

// ParsePin parses a pinned executable's SHA-256 written as 64 hex digits.
func ParsePin(s string) ([sha256.Size]byte, error) {
	var pin [sha256.Size]byte
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != sha256.Size {
		return pin, fmt.Errorf("executable pin %q: want 64 hex digits (a SHA-256)", s)
	}
	return [sha256.Size]byte(b), nil
}
