package api

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/tickets"
	"github.com/bettercompute/bettercompute/internal/tunnels"
	"github.com/bettercompute/bettercompute/internal/tunnelwire"
)

// TunnelConnectPath is the tunnel endpoint: GET with Upgrade:
// bc-tunnel-v1, the query node=<id>&port=<p>, the header Bc-Ticket (from
// tunnels.open) and the caller's credential as for every call. It passes
// the envelope's stages as the upload endpoint does, decided
// compute:nodes:tunnel on the node; then the ticket must be the caller's
// own for that node and port, and the gateway and the node verify it
// again. On success it answers 101 Switching Protocols and the
// connection carries tunnelwire frames; any refusal is an ordinary error
// answer.
const TunnelConnectPath = "/api/v1/tunnels/connect"

// TicketHeader carries the ticket to the tunnel endpoint.
const TicketHeader = "Bc-Ticket"

// ExecTarget returns the node an interactive exec in a sandbox goes to
// (sandboxes.Service.ExecTarget): a sandbox the scope cannot see is
// NOT_FOUND, one not running or expiring within a minute INVALID_STATE.
type ExecTarget func(ctx context.Context, scope iam.Scope, sandboxID string) (nodeID string, err error)

// ServeTunnels enables the tunnel endpoint with t behind it; exec, when
// set, lets it carry interactive execs in sandboxes.
func (s *Server) ServeTunnels(t *tunnels.Service, exec ExecTarget) { s.tunnels, s.execTarget = t, exec }

// tunnelMethods are the tunnels module's JSON methods.
func tunnelMethods(m Modules) []Method {
	if m.Tunnels == nil {
		return nil
	}
	t := m.Tunnels
	methods := []Method{
		Def("tunnels.open", tickets.ActionNodeTunnel, true, func(in apitypes.TunnelOpenIn) Target { return Target{Kind: "node", ID: in.NodeID} },
			func(ctx context.Context, c *Caller, in apitypes.TunnelOpenIn) (any, error) {
				tk, err := t.Open(ctx, c.Actor(), in.NodeID, uint32(in.Port), tickets.ActionNodeTunnel)
				if err != nil {
					return nil, err
				}
				return apitypes.TunnelTicket{Ticket: tk.Ticket, JTI: tk.JTI, NodeID: tk.NodeID, Port: tk.Port, ExpiresAt: tk.ExpiresAt,
					ConnectPath: TunnelConnectPath}, nil
			}).ShownOnce().LimitedPerIdentity(t.Limiter(), tunnels.LimitMessage),
	}
	if m.Sandboxes == nil {
		return methods
	}
	sbx := m.Sandboxes
	return append(methods,
		Def("sandboxes.execTicket", tickets.ActionSandboxExec, true, func(in apitypes.ExecTicketIn) Target { return Target{Kind: "sandbox", ID: in.ID} },
			func(ctx context.Context, c *Caller, in apitypes.ExecTicketIn) (any, error) {
				node, err := sbx.ExecTarget(ctx, c.Scope(), in.ID)
				if err != nil {
					return nil, err
				}
				tk, err := t.OpenExec(ctx, c.Actor(), in.ID, node, in.Argv)
				if err != nil {
					return nil, err
				}
				return apitypes.TunnelTicket{Ticket: tk.Ticket, JTI: tk.JTI, NodeID: tk.NodeID, SandboxID: tk.SandboxID, ExpiresAt: tk.ExpiresAt,
					ConnectPath: TunnelConnectPath}, nil
			}).ShownOnce().LimitedPerIdentity(t.Limiter(), tunnels.LimitMessage))
}

// serveTunnelHTTP answers a request to the tunnel endpoint: an error in
// the envelope's shape, or the upgraded connection for the tunnel's life.
func (s *Server) serveTunnelHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rid := SecurityHeaders(w, r)
	const label = "tunnels.connect"
	q, t, a := s.admitTunnel(r, rid)
	if t == nil {
		if retry := q.out.retryAfter; retry > 0 {
			w.Header().Set("Retry-After", fmt.Sprint(int((retry+time.Second-1)/time.Second)))
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.status)
		_, _ = w.Write(a.body)
		s.requests.WithLabelValues(label, fmt.Sprint(a.status)).Inc()
		s.latency.WithLabelValues(label).Observe(time.Since(start).Seconds())
		return
	}
	s.requests.WithLabelValues(label, "101").Inc()
	s.latency.WithLabelValues(label).Observe(time.Since(start).Seconds())
	s.serveTunnel(w, q, t)
}

// admitTunnel runs the envelope's stages for the tunnel endpoint and
// opens the tunnel: its request shape, authentication (the identity's
// rate limit too), its tenant's state (as a mutation: a suspended
// tenant opens no tunnel), one mutation slot held only while admitting,
// the node's resolution (another tenant's node answers as a missing one),
// the IAM decision, and the module's Connect.
func (s *Server) admitTunnel(r *http.Request, rid string) (*call, *tunnels.Tunnel, answer) {
	m := Method{Name: "tunnels.connect", Action: tickets.ActionNodeTunnel, Mutates: true}
	q := &call{r: r, ctx: r.Context(), m: m, known: true,
		c: &Caller{RequestID: rid, Addr: s.cfg.TrustedProxies.ClientAddr(r)}}
	if err := tunnelShape(r); err != nil {
		return q, nil, s.errorAnswer(rid, err)
	}
	if err := s.authenticateCaller(q); err != nil {
		return q, nil, s.errorAnswer(rid, err)
	}
	to, ticket, err := s.tunnelParams(r)
	if err != nil {
		return q, nil, s.errorAnswer(rid, err)
	}
	q.m.Action = to.Action
	q.target = Target{Kind: "node", ID: to.NodeID}
	if to.SandboxID != "" {
		q.target = Target{Kind: "sandbox", ID: to.SandboxID}
	}
	if err := s.callerState(q); err != nil {
		return q, nil, s.errorAnswer(rid, err)
	}
	release, err := s.limit(q)
	if err != nil {
		return q, nil, s.errorAnswer(rid, err)
	}
	err = s.scope(q)
	if err == nil {
		err = s.decide(q)
	}
	release()
	if err == nil && to.SandboxID != "" {
		// The sandbox's node, now: running, not expiring within a minute.
		to.NodeID, err = s.execTarget(q.ctx, q.c.Scope(), to.SandboxID)
	}
	if err != nil {
		return q, nil, s.errorAnswer(rid, err)
	}
	t, err := s.tunnels.Connect(q.ctx, q.c.Actor(), to, ticket)
	if err != nil {
		return q, nil, s.errorAnswer(rid, err)
	}
	return q, t, answer{}
}

// tunnelShape is the tunnel endpoint's request-shape check: GET with
// X-Better-Compute: 1 (which a cross-site page cannot send) and the
// upgrade to tunnelwire.Protocol.
func tunnelShape(r *http.Request) error {
	if r.Method != http.MethodGet || r.Header.Get("X-Better-Compute") != "1" ||
		!strings.EqualFold(r.Header.Get("Upgrade"), tunnelwire.Protocol) || !headerHasToken(r.Header, "Connection", "upgrade") {
		return errs.New(errs.CSRFRejected, "GET with Upgrade: "+tunnelwire.Protocol+", Connection: Upgrade and X-Better-Compute: 1 is required")
	}
	return nil
}

// headerHasToken reports whether a comma-separated header lists token.
func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// tunnelParams reads what a tunnel request goes to (node=ID&port=P, or
// sandbox=ID for an exec, where the node is the sandbox's) and its ticket.
func (s *Server) tunnelParams(r *http.Request) (tunnels.Target, string, error) {
	qv := r.URL.Query()
	ticket := r.Header.Get(TicketHeader)
	if ticket == "" {
		return tunnels.Target{}, "", errs.New(errs.InvalidInput, TicketHeader+": the ticket from tunnels.open or sandboxes.execTicket is required")
	}
	if sbx := qv.Get("sandbox"); sbx != "" || qv.Has("sandbox") {
		if s.execTarget == nil {
			return tunnels.Target{}, "", errs.New(errs.InvalidInput, "sandbox: this control plane runs no sandboxes")
		}
		if sbx == "" || len(sbx) > 64 || qv.Has("node") || qv.Has("port") {
			return tunnels.Target{}, "", errs.New(errs.InvalidInput, "sandbox: a sandbox id is required, without node or port")
		}
		return tunnels.Target{SandboxID: sbx, Action: tickets.ActionSandboxExec}, ticket, nil
	}
	nodeID := qv.Get("node")
	if nodeID == "" || len(nodeID) > 64 {
		return tunnels.Target{}, "", errs.New(errs.InvalidInput, "node: a node id is required")
	}
	p, perr := strconv.ParseUint(qv.Get("port"), 10, 16)
	if perr != nil || p == 0 {
		return tunnels.Target{}, "", errs.New(errs.InvalidInput, "port: 1 to 65535")
	}
	return tunnels.Target{NodeID: nodeID, Port: uint32(p), Action: tickets.ActionNodeTunnel}, ticket, nil
}

// serveTunnel takes over the connection, answers 101 and serves the
// tunnel until it ends; every tunnels.RecheckEvery the caller is
// re-decided exactly as the envelope decided it.
func (s *Server) serveTunnel(w http.ResponseWriter, q *call, t *tunnels.Tunnel) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		s.deps.Log.Error("tunnel over a connection that cannot be taken over", "request_id", q.c.RequestID)
		s.tunnels.Abandon(t)
		a := errorBody(q.c.RequestID, errs.InvalidInput, "the tunnel endpoint needs HTTP/1.1")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.status)
		_, _ = w.Write(a.body)
		return
	}
	conn, rw, err := hj.Hijack()
	if err != nil {
		s.deps.Log.Error("tunnel hijack failed", "request_id", q.c.RequestID, "err", err)
		s.tunnels.Abandon(t)
		return
	}
	_ = conn.SetDeadline(time.Time{}) // the server's request deadlines do not apply to a tunnel
	_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: " + tunnelwire.Protocol + "\r\nConnection: Upgrade\r\nX-Request-Id: " + q.c.RequestID + "\r\n\r\n")
	if err := rw.Flush(); err != nil {
		_ = conn.Close()
		s.tunnels.Abandon(t)
		return
	}
	ctx := context.WithoutCancel(q.ctx)
	why := s.tunnels.Serve(ctx, t, rw.Reader, flushWriter{rw.Writer}, func() { _ = conn.Close() },
		func(ctx context.Context) (bool, error) { return s.recheck(ctx, q) })
	s.deps.Log.Info("tunnel ended", "request_id", q.c.RequestID, "why", why)
}

// flushWriter writes through a bufio.Writer at once.
type flushWriter struct{ w *bufio.Writer }

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if err == nil {
		err = f.w.Flush()
	}
	return n, err
}

// recheck decides an open tunnel's caller again, as the envelope did:
// the credential (revoked or expired: refused), the same identity, its
// tenant's state (suspended or deleted: refused), the node's reach (gone
// or moved out of reach: refused) and the action. A refusal is false
// with a nil error; anything that could not be decided is an error.
func (s *Server) recheck(ctx context.Context, q0 *call) (bool, error) {
	p, err := s.authenticate(ctx, q0.r)
	if err != nil {
		if errs.CodeOf(err) == errs.Unauthenticated {
			return false, nil
		}
		return false, err
	}
	if p.Identity != q0.c.Identity {
		return false, nil
	}
	q := &call{r: q0.r, ctx: ctx, m: q0.m, known: true, target: q0.target,
		c: &Caller{Principal: p, RequestID: q0.c.RequestID, Addr: q0.c.Addr}}
	for _, stage := range []func(*call) error{s.callerState, s.scope, s.decide} {
		if err := stage(q); err != nil {
			switch errs.CodeOf(err) {
			case errs.AccessDenied, errs.NotFound, errs.TenantSuspended, errs.Unauthenticated:
				return false, nil
			}
			return false, err
		}
	}
	return true, nil
}
