package hosthelper

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"time"

	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
)

// dispatch runs a decoded request's operation for an allowed caller.
func (s *Server) dispatch(ctx context.Context, c Caller, req *helperwire.Request) (json.RawMessage, *helperwire.Refusal) {
	switch req.Op {
	case helperwire.OpPing:
		return mustJSON(helperwire.Ping{Version: helperwire.Version, PID: c.PID, UID: c.UID, GID: c.GID}), nil
	case helperwire.OpEventsDrain:
		return mustJSON(s.drain()), nil
	}
	s.mu.Lock()
	r, ok := s.routes[req.Op]
	s.mu.Unlock()
	if !ok {
		return nil, refuse(helperwire.CodeUnknownOp, "operation not served by this helper")
	}
	if r.changesHost {
		if s.cfg.Intent == nil {
			return nil, refuse(helperwire.CodeIntentMissing, "no desired-state check configured: host-changing operations are refused")
		}
		if err := s.cfg.Intent(req); err != nil {
			return nil, s.asRefusal(c, req.Op, err)
		}
	}
	res, err := s.run(ctx, c, req, r.h)
	if err != nil {
		return nil, s.asRefusal(c, req.Op, err)
	}
	return res, nil
}

// errPanicked stands for a handler that panicked.
var errPanicked = errors.New("handler panicked")

// run calls h, turning a panic into an error so one bad operation cannot
// take the helper down.
func (s *Server) run(ctx context.Context, c Caller, req *helperwire.Request, h Handler) (res json.RawMessage, err error) {
	defer func() {
		if recover() != nil {
			res, err = nil, errPanicked
		}
	}()
	return h(ctx, c, req)
}

// asRefusal answers a *helperwire.Refusal as itself and any other error as
// CodeFailed with a generic reason, logging the detail only.
func (s *Server) asRefusal(c Caller, op string, err error) *helperwire.Refusal {
	var ref *helperwire.Refusal
	if errors.As(err, &ref) {
		return ref
	}
	s.cfg.Log.Error("helper operation failed", "pid", c.PID, "uid", c.UID, "op", op, "err", err)
	return refuse(helperwire.CodeFailed, "operation failed; see the helper's log")
}

// answer writes the response, logs it and records the event.
func (s *Server) answer(c *net.UnixConn, caller Caller, op string, result json.RawMessage, ref *helperwire.Refusal) {
	resp := helperwire.Response{Version: helperwire.Version, Result: result}
	if ref == nil {
		if b, _ := json.Marshal(resp); len(b) > helperwire.MaxResponse {
			ref = refuse(helperwire.CodeFailed, "result over the response bound")
			s.cfg.Log.Error("helper result too large", "pid", caller.PID, "uid", caller.UID, "op", op, "bytes", len(b))
		}
	}
	if ref != nil {
		resp = helperwire.Response{Version: helperwire.Version, Code: ref.Code, Reason: ref.Reason}
	}
	s.record(caller, op, ref)
	b, _ := json.Marshal(resp)
	_ = c.SetDeadline(time.Now().Add(s.cfg.ReadTimeout)) // a fresh bound for the answer
	if _, err := c.Write(b); err == nil {
		_ = c.CloseWrite()
	}
	// Discard, unparsed and bounded, what a refused caller still sent: a
	// Unix socket closed with unread input resets the peer, which would
	// lose the answer before the caller reads it.
	_, _ = io.Copy(io.Discard, io.LimitReader(c, helperwire.MaxRequest+1))
}

// record logs one outcome and keeps it as an event: every refusal and
// every operation that changed the host. A read that succeeded (ping,
// events.drain, sandbox.labels, the node's poll of sandbox.failures) is
// logged at debug level and not kept, or the node's polls would fill the
// buffer and the audit log with themselves.
func (s *Server) record(c Caller, op string, ref *helperwire.Refusal) {
	ev := helperwire.Event{AtMs: s.cfg.Clock.Now().UnixMilli(), PID: c.PID, UID: c.UID, Op: op}
	if ref != nil {
		ev.Code, ev.Reason = ref.Code, ref.Reason
		s.cfg.Log.Warn("helper refused request", "pid", c.PID, "uid", c.UID, "gid", c.GID, "op", op, "code", ref.Code, "reason", ref.Reason)
	} else if !s.changesHost(op) {
		s.cfg.Log.Debug("helper read done", "pid", c.PID, "uid", c.UID, "gid", c.GID, "op", op)
		return
	} else {
		s.cfg.Log.Info("helper operation done", "pid", c.PID, "uid", c.UID, "gid", c.GID, "op", op)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.events) >= s.cfg.MaxEvents {
		n := copy(s.events, s.events[1:])
		s.events = s.events[:n]
		s.drops++
	}
	s.events = append(s.events, ev)
}

// changesHost reports whether op is a served host-changing operation.
func (s *Server) changesHost(op string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.routes[op]
	return ok && r.changesHost
}

// drain returns and forgets the kept events and the count dropped.
func (s *Server) drain() helperwire.Events {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := helperwire.Events{Events: s.events, Dropped: s.drops}
	if out.Events == nil {
		out.Events = []helperwire.Event{}
	}
	s.events, s.drops = nil, 0
	return out
}

// mustJSON marshals a value of a wire type, which cannot fail.
func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic("hosthelper: marshal wire type: " + err.Error())
	}
	return b
}
