package tunnels

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/tunnelwire"
)

// Tunnel is one open tunnel between a client and a node.
type Tunnel struct {
	node   NodeStream
	actor  audit.Entry
	jti    string
	nodeID string
	port   uint32
	// sandboxID and action: an exec's sandbox, and the ticket's action.
	sandboxID string
	action    string
	opened    time.Time

	once   sync.Once
	why    error // nil: ended in order (both sides sent eof)
	closed chan struct{}
}

// Recheck re-decides the caller of an open tunnel: its credential, its
// tenant's state, the node's reach and the ticket's action. allowed false
// (with a nil error) is a refusal and closes the tunnel at once; an error
// means the decision could not be made, which closes the tunnel only
// after FailFor of errors.
type Recheck func(ctx context.Context) (allowed bool, err error)

// The reasons a tunnel is closed, as the client's error frame says them.
var (
	errRevoked   = errs.New(errs.AccessDenied, "access to the node was revoked; the tunnel is closed")
	errUndecided = errs.New(errs.Unavailable, "access could not be decided for 2 minutes; the tunnel is closed")
	errLifetime  = errs.New(errs.InvalidState, "the tunnel reached its 12-hour limit")
	errStopping  = errs.New(errs.Unavailable, "the control plane is stopping")
	errClientBad = errs.New(errs.InvalidInput, "the client sent a malformed frame")
)

// close ends the tunnel once, for why (nil: in order).
func (t *Tunnel) close(why error) {
	t.once.Do(func() {
		t.why = why
		close(t.closed)
	})
}

// Serve carries t between the client (frames read from r, written to w)
// and the node until it ends, then closes the node's stream and calls
// closeClient. Every RecheckEvery it asks recheck; see Recheck. It
// returns why the tunnel ended (nil: in order) after writing it to the
// client as an error frame, and records the end in the audit log.
func (s *Service) Serve(ctx context.Context, t *Tunnel, r io.Reader, w io.Writer, closeClient func(), recheck Recheck) error {
	if recheck == nil {
		t.close(errNoRecheck)
	}
	defer func() {
		s.mu.Lock()
		delete(s.open, t)
		s.mu.Unlock()
	}()
	var wmu sync.Mutex
	write := func(b []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		_, err := w.Write(b)
		return err
	}
	var eofs sync.WaitGroup
	eofs.Add(2)
	go s.nodeToClient(t, write, &eofs)
	go s.clientToNode(t, r, &eofs)
	go func() { eofs.Wait(); t.close(nil) }()
	s.watch(ctx, t, recheck)

	why := t.why
	reason := "closed"
	if why != nil {
		reason = string(errs.CodeOf(why))
		_ = write(tunnelwire.RefusalFrame(string(errs.CodeOf(why)), errs.SafeMessage(why)))
	}
	t.node.Close(reason)
	// The end is recorded before the client's connection closes, so a
	// client that saw its tunnel end finds the row.
	s.recordClose(ctx, t, why)
	closeClient()
	return why
}

// watch re-decides the caller every RecheckEvery, and ends the tunnel at
// MaxLife, when its node stream ends or ctx does, until it is closed.
func (s *Service) watch(ctx context.Context, t *Tunnel, recheck Recheck) {
	tick := s.d.Clock.NewTicker(RecheckEvery)
	defer tick.Stop()
	life := s.d.Clock.NewTimer(MaxLife - s.d.Clock.Now().Sub(t.opened))
	defer life.Stop()
	lastDecided := s.d.Clock.Now()
	for {
		select {
		case <-t.closed:
			return
		case <-ctx.Done():
			t.close(errStopping)
		case <-life.C():
			t.close(errLifetime)
		case <-t.node.Done():
			t.close(errNodeGone)
		case <-tick.C():
			ok, err := recheck(ctx)
			now := s.d.Clock.Now()
			switch {
			case err == nil && ok:
				lastDecided = now
			case err == nil:
				s.d.Log.Info("tunnel access revoked", "node_id", t.nodeID, "jti", t.jti, "caller", t.actor.Actor)
				t.close(errRevoked)
			case now.Sub(lastDecided) >= FailFor:
				s.d.Log.Warn("tunnel access undecided", "node_id", t.nodeID, "jti", t.jti, "err", err)
				t.close(errUndecided)
			default:
				s.d.Log.Warn("tunnel recheck failed", "node_id", t.nodeID, "jti", t.jti, "err", err)
			}
		}
	}
}

// errNodeGone: the node's stream ended under the tunnel (its session
// ended: the node disconnected, or its certificate was revoked).
var errNodeGone = errs.New(errs.Unavailable, "the node disconnected; the tunnel is closed")

// nodeToClient copies what the node sends to the client as frames.
func (s *Service) nodeToClient(t *Tunnel, write func([]byte) error, eofs *sync.WaitGroup) {
	buf := make([]byte, 0, tunnelwire.MaxData+5)
	for {
		c, err := t.node.Recv()
		data, eof := c.Data, c.EOF
		switch {
		case err != nil:
			if errs.CodeOf(err) == errs.Internal {
				err = errNodeGone
			}
			t.close(err)
			return
		case c.Exit != nil:
			// An exec ended: its status is the tunnel's last frame, and
			// the tunnel ends in order.
			if write(tunnelwire.ExitFrame(*c.Exit)) != nil {
				t.close(errClientGone)
				return
			}
			t.close(nil)
			return
		case eof:
			if write(tunnelwire.Append(buf[:0], tunnelwire.EOF, nil)) != nil {
				t.close(errClientGone)
				return
			}
			eofs.Done()
			// The node sends nothing more; wait for the tunnel's end.
			<-t.closed
			return
		}
		if write(tunnelwire.Append(buf[:0], tunnelwire.Data, data)) != nil {
			t.close(errClientGone)
			return
		}
	}
}

// errClientGone: the client's connection failed.
var errClientGone = errs.New(errs.Unavailable, "the client's connection ended")

// clientToNode copies the client's frames to the node.
func (s *Service) clientToNode(t *Tunnel, r io.Reader, eofs *sync.WaitGroup) {
	rd := tunnelwire.NewReader(r)
	for {
		f, err := rd.Next()
		if err != nil {
			if errors.Is(err, tunnelwire.ErrFrame) {
				t.close(errClientBad)
			} else {
				t.close(errClientGone)
			}
			return
		}
		switch f.Type {
		case tunnelwire.Data:
			if t.node.Send(f.Payload) != nil {
				t.close(errNodeGone)
				return
			}
		case tunnelwire.EOF:
			if t.node.CloseSend() != nil {
				t.close(errNodeGone)
				return
			}
			eofs.Done()
			<-t.closed
			return
		case tunnelwire.Resize:
			if t.node.Resize(tunnelwire.DecodeResize(f.Payload)) != nil {
				t.close(errNodeGone)
				return
			}
		case tunnelwire.Error:
			t.close(errClientGone)
			return
		default: // an exit status is the node's to send
			t.close(errClientBad)
			return
		}
	}
}

// recordClose writes the tunnel's end to the audit log (a failure is
// logged: the tunnel is closed either way).
func (s *Service) recordClose(ctx context.Context, t *Tunnel, why error) {
	e := t.actor
	now := s.d.Clock.Now()
	e.Action, e.Resource, e.Outcome = t.action, "node/"+t.nodeID, "tunnel-closed"
	if t.sandboxID != "" {
		e.Resource = "sandbox/" + t.sandboxID
	}
	reason := "closed"
	if why != nil {
		reason = string(errs.CodeOf(why)) + ": " + errs.SafeMessage(why)
	}
	e.Details = map[string]any{"jti": t.jti, "reason": reason, "seconds": int64(now.Sub(t.opened).Seconds())}
	if t.port != 0 {
		e.Details["port"] = t.port
	}
	c := context.WithoutCancel(ctx)
	err := s.d.DB.Tx(c, func(tx *sql.Tx) error { return audit.Record(c, tx, now, e) })
	if err != nil {
		s.d.Log.Error("record tunnel close", "node_id", t.nodeID, "jti", t.jti, "err", err)
	}
}
