package api

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/tunnels"
)

// LaneConnectPath is the bastion lane endpoint: GET with Upgrade:
// bc-lane-v1, Connection: Upgrade, X-Better-Compute: 1, the query
// bastion=<id>&lane=<lane> and the caller's credential as for every call.
// It passes the envelope's stages as the tunnel endpoint does, deciding
// compute:bastions:connect on the bastion (another tenant's bastion
// answers as a missing one); then the lanes role opens the lane through
// the bastion's tunnel, where the bastion checks it again against its
// grants. On success it answers 101 Switching Protocols and the
// connection carries the lane's bytes as they are.
const LaneConnectPath = "/api/v1/bastions/connect"

// LaneProtocol is the Upgrade token of the lane endpoint.
const LaneProtocol = "bc-lane-v1"

// LaneOpener opens a lane on a bastion for an allowed caller and records
// the opening in the audit log (the lanes role, with the bastions module).
type LaneOpener interface {
	OpenLane(ctx context.Context, actor audit.Entry, bastionID, lane string) (net.Conn, error)
}

// ServeBastionLanes enables the lane endpoint with o behind it.
func (s *Server) ServeBastionLanes(o LaneOpener) { s.lanes = o }

// laneRE is a lane's shape: inference/<kind>, service/<name> or
// egress/<host:port> (the bastion checks the target again).
var laneRE = regexp.MustCompile(`^(inference/(ollama|llm|pii)|service/[a-z0-9][a-z0-9-]{0,62}|egress/[A-Za-z0-9.:\[\]-]{1,260})$`)

// bastionUpgrade is one of the endpoints that upgrade a connection to a
// bastion (lanes, terminals): its method name and action (decided on the
// bastion), its Upgrade token, how it reads its query and how it opens
// the connection once the caller is decided.
type bastionUpgrade struct {
	method, action, protocol string
	// query returns the bastion's id from the query, or an INVALID_INPUT
	// error.
	query func(url.Values) (string, error)
	open  func(q *call, bastionID string) (net.Conn, error)
}

// laneUpgrade is the lane endpoint.
func (s *Server) laneUpgrade() bastionUpgrade {
	var lane string
	return bastionUpgrade{method: "bastions.connect", action: ActionBastionsConnect, protocol: LaneProtocol,
		query: func(qv url.Values) (string, error) {
			id := qv.Get("bastion")
			lane = qv.Get("lane")
			if id == "" || len(id) > 64 || !laneRE.MatchString(lane) {
				return "", errs.New(errs.InvalidInput, "bastion=ID and lane=inference/ollama|inference/llm|inference/pii|service/NAME|egress/HOST:PORT are required")
			}
			return id, nil
		},
		open: func(q *call, id string) (net.Conn, error) { return s.lanes.OpenLane(q.ctx, q.c.Actor(), id, lane) },
	}
}

// serveLaneHTTP answers a request to the lane endpoint: an error in the
// envelope's shape, or the upgraded connection for the lane's life.
func (s *Server) serveLaneHTTP(w http.ResponseWriter, r *http.Request) {
	s.serveBastionUpgrade(w, r, s.laneUpgrade())
}

// serveBastionUpgrade answers a request to one of the bastion upgrade
// endpoints: an error in the envelope's shape, or the upgraded connection
// for its life.
func (s *Server) serveBastionUpgrade(w http.ResponseWriter, r *http.Request, u bastionUpgrade) {
	start := time.Now()
	rid := SecurityHeaders(w, r)
	q, conn, a := s.admitUpgrade(r, rid, u)
	if conn == nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.status)
		_, _ = w.Write(a.body)
		s.requests.WithLabelValues(u.method, fmt.Sprint(a.status)).Inc()
		s.latency.WithLabelValues(u.method).Observe(time.Since(start).Seconds())
		return
	}
	s.requests.WithLabelValues(u.method, "101").Inc()
	s.latency.WithLabelValues(u.method).Observe(time.Since(start).Seconds())
	s.serveLane(w, q, conn, u.protocol)
}

// admitUpgrade runs the envelope's stages for an upgrade endpoint, then
// opens its connection.
func (s *Server) admitUpgrade(r *http.Request, rid string, u bastionUpgrade) (*call, net.Conn, answer) {
	m := Method{Name: u.method, Action: u.action, Mutates: true}
	q := &call{r: r, ctx: r.Context(), m: m, known: true,
		c: &Caller{RequestID: rid, Addr: s.cfg.TrustedProxies.ClientAddr(r)}}
	if r.Method != http.MethodGet || r.Header.Get("X-Better-Compute") != "1" ||
		!strings.EqualFold(r.Header.Get("Upgrade"), u.protocol) || !headerHasToken(r.Header, "Connection", "upgrade") {
		return q, nil, s.errorAnswer(rid, errs.New(errs.CSRFRejected, "GET with Upgrade: "+u.protocol+", Connection: Upgrade and X-Better-Compute: 1 is required"))
	}
	if err := s.authenticateCaller(q); err != nil {
		return q, nil, s.errorAnswer(rid, err)
	}
	id, err := u.query(r.URL.Query())
	if err != nil {
		return q, nil, s.errorAnswer(rid, err)
	}
	q.target = Target{Kind: "bastion", ID: id}
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
	if err != nil {
		return q, nil, s.errorAnswer(rid, err)
	}
	conn, err := u.open(q, id)
	if err != nil {
		return q, nil, s.errorAnswer(rid, err)
	}
	return q, conn, answer{}
}

// serveLane takes over the client's connection, answers 101 (Upgrade:
// protocol) and copies bytes both ways until either side ends.
func (s *Server) serveLane(w http.ResponseWriter, q *call, lane net.Conn, protocol string) {
	defer lane.Close()
	hj, ok := w.(http.Hijacker)
	if !ok {
		a := errorBody(q.c.RequestID, errs.InvalidInput, "the lane endpoint needs HTTP/1.1")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.status)
		_, _ = w.Write(a.body)
		return
	}
	conn, rw, err := hj.Hijack()
	if err != nil {
		s.deps.Log.Error("lane hijack failed", "request_id", q.c.RequestID, "err", err)
		return
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Time{})
	_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: " + protocol + "\r\nConnection: Upgrade\r\nX-Request-Id: " + q.c.RequestID + "\r\n\r\n")
	if err := rw.Flush(); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	stopWatch := make(chan struct{})
	defer close(stopWatch)
	go s.watchLane(q, stopWatch, func() { _ = conn.Close(); _ = lane.Close() })
	go func() {
		// What the client sent along with its request is in rw.Reader.
		_, _ = io.Copy(lane, rw.Reader)
		if cw, ok := lane.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			_ = lane.Close()
		}
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(conn, lane)
		if cw, ok := conn.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		done <- struct{}{}
	}()
	<-done
	<-done
	s.deps.Log.Info("lane ended", "request_id", q.c.RequestID)
}

// watchLane re-decides an open lane's caller every tunnels.RecheckEvery,
// as the tunnel endpoint does: a revoked credential, a removed binding, a
// suspended tenant or another tenant's bastion closes it (end), and so
// do decisions that keep failing for tunnels.FailFor; it returns when
// stop is closed.
func (s *Server) watchLane(q *call, stop <-chan struct{}, end func()) {
	tick := s.deps.Clock.NewTicker(tunnels.RecheckEvery)
	defer tick.Stop()
	ctx := context.WithoutCancel(q.ctx)
	lastDecided := s.deps.Clock.Now()
	for {
		select {
		case <-stop:
			return
		case <-tick.C():
		}
		ok, err := s.recheck(ctx, q)
		now := s.deps.Clock.Now()
		switch {
		case err == nil && ok:
			lastDecided = now
			continue
		case err == nil:
			s.deps.Log.Info("lane access revoked", "request_id", q.c.RequestID)
		case now.Sub(lastDecided) < tunnels.FailFor:
			continue
		default:
			s.deps.Log.Warn("lane access undecided: closing", "request_id", q.c.RequestID, "err", err)
		}
		end()
		return
	}
}
