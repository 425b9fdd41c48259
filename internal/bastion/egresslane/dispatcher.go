package egresslane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
)

// HelloTimeout is how long an accepted connection has to send its hello
// before the Dispatcher closes it.
const HelloTimeout = 10 * time.Second

// MaxParked is how many parked workers one bastion may hold on the CP; a
// hello beyond it is closed, so a bastion cannot tie up the CP's sockets.
const MaxParked = 32

// ErrNoWorker is wrapped by Dial's error when no worker of the bastion was
// parked before the caller's context ended.
var ErrNoWorker = errors.New("egresslane: no egress worker parked")

// RefusedError is the bastion's refusal of a target, with its stable
// reason (ReasonBusy, ReasonNotGranted, a netguard reason, ...). Match it
// with errors.As.
type RefusedError struct {
	// Reason is the bastion's reason code, checked to be a short
	// lowercase code before it is passed on.
	Reason string
}

// Error names the reason.
func (e *RefusedError) Error() string {
	return "egresslane: bastion refused the target: " + e.Reason
}

// Dispatcher is the CP's side of the egress lane: it holds the workers
// that bastions park on it, keyed by bastion, and hands each one job. It
// is safe for concurrent use.
type Dispatcher struct {
	clk clock.Clock
	log *slog.Logger

	mu     sync.Mutex
	parked map[string][]*parkedConn
	wake   map[string]chan struct{} // closed when a worker of that bastion parks
}

// parkedConn is one parked worker. A watcher goroutine reads it while it
// waits, so a worker that hangs up (or speaks out of turn) leaves at once.
type parkedConn struct {
	conn    net.Conn
	bastion string
	taken   bool          // set under Dispatcher.mu by Dial or Drop
	spoke   bool          // the watcher read a byte or an end, not our deadline
	done    chan struct{} // closed when the watcher returns
}

// NewDispatcher returns a Dispatcher with no parked workers. clk times the
// hello; log may be nil.
func NewDispatcher(clk clock.Clock, log *slog.Logger) *Dispatcher {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Dispatcher{clk: clk, log: log, parked: map[string][]*parkedConn{}, wake: map[string]chan struct{}{}}
}

// Serve accepts workers on ln until ctx ends, then closes ln and returns
// nil once every connection still saying hello is handled. who maps a
// connection's remote address to its bastion's id; a connection it does
// not know (false) is closed before a byte is read. A worker parks once it
// sent a valid hello within HelloTimeout.
func (d *Dispatcher) Serve(ctx context.Context, ln net.Listener, who func(net.Addr) (string, bool)) error {
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("egresslane: accept: %w", err)
		}
		wg.Go(func() { d.admit(ctx, conn, who) })
	}
}

// admit identifies conn's bastion, reads its hello and parks it.
func (d *Dispatcher) admit(ctx context.Context, conn net.Conn, who func(net.Addr) (string, bool)) {
	id, ok := who(conn.RemoteAddr())
	if !ok {
		d.log.Warn("egress connection from an unknown peer closed", "peer", peer(conn))
		_ = conn.Close()
		return
	}
	if err := d.readHello(ctx, conn); err != nil {
		d.log.Warn("egress worker hello refused", "bastion", id, "peer", peer(conn), "err", err)
		_ = conn.Close()
		return
	}
	d.park(id, conn)
}

// readHello reads and checks the hello, closing conn when HelloTimeout
// passes on the clock or ctx ends first.
func (d *Dispatcher) readHello(ctx context.Context, conn net.Conn) error {
	t := d.clk.NewTimer(HelloTimeout)
	done := make(chan struct{})
	expired := false
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-t.C():
			expired = true
			_ = conn.Close()
		case <-ctx.Done():
			expired = true
			_ = conn.Close()
		case <-done:
		}
	})
	line, err := readLine(conn)
	close(done)
	t.Stop()
	wg.Wait()
	switch {
	case expired:
		return errors.New("egresslane: no hello in time")
	case err != nil:
		return err
	}
	return decodeHello(line)
}

// park adds conn to id's parked workers, wakes a waiting Dial and starts
// the watcher. Over MaxParked it closes conn.
func (d *Dispatcher) park(id string, conn net.Conn) {
	p := &parkedConn{conn: conn, bastion: id, done: make(chan struct{})}
	d.mu.Lock()
	if len(d.parked[id]) >= MaxParked {
		d.mu.Unlock()
		d.log.Warn("egress worker over the parked limit closed", "bastion", id, "limit", MaxParked)
		_ = conn.Close()
		return
	}
	d.parked[id] = append(d.parked[id], p)
	if w := d.wake[id]; w != nil {
		close(w)
		delete(d.wake, id)
	}
	d.mu.Unlock()
	go d.watch(p)
}

// watch reads one byte of a parked worker. A parked worker sends nothing,
// so anything but the deadline claim sets means it is gone: it is removed
// and closed unless Dial or Drop took it first.
func (d *Dispatcher) watch(p *parkedConn) {
	var b [1]byte
	n, err := p.conn.Read(b[:])
	d.mu.Lock()
	// claim's deadline ends the read: os.ErrDeadlineExceeded on a kernel
	// socket, a net.Error whose Timeout is true on the user-space tunnel's
	// (gVisor's gonet). Anything else is the worker hanging up.
	var ne net.Error
	timedOut := errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
	p.spoke = n > 0 || !timedOut
	if !p.taken {
		p.taken = true
		d.parked[p.bastion] = slices.DeleteFunc(d.parked[p.bastion], func(x *parkedConn) bool { return x == p })
		if len(d.parked[p.bastion]) == 0 {
			delete(d.parked, p.bastion)
		}
		_ = p.conn.Close()
	}
	d.mu.Unlock()
	close(p.done)
}

// Parked returns how many workers of bastionID are parked now.
func (d *Dispatcher) Parked(bastionID string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.parked[bastionID])
}

// Drop closes every parked worker of bastionID (an unpaired bastion).
// Connections already spliced belong to their Dial callers.
func (d *Dispatcher) Drop(bastionID string) {
	d.mu.Lock()
	q := d.parked[bastionID]
	delete(d.parked, bastionID)
	for _, p := range q {
		p.taken = true
	}
	d.mu.Unlock()
	for _, p := range q {
		_ = p.conn.Close()
	}
	d.log.Info("egress workers dropped", "bastion", bastionID, "closed", len(q))
}

// Dial asks one of bastionID's parked workers to connect to target
// ("host:port", see ValidTarget) and returns the connection, spliced by
// the bastion to the target. With no worker parked it waits until one
// parks or ctx ends (the caller bounds it), then fails wrapping
// ErrNoWorker. A refusal is a *RefusedError with the bastion's reason.
func (d *Dispatcher) Dial(ctx context.Context, bastionID, target string) (net.Conn, error) {
	if err := ValidTarget(target); err != nil {
		return nil, err
	}
	conn, err := d.take(ctx, bastionID)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	v, err := exchange(conn, target)
	if !stop() {
		_ = conn.Close()
		return nil, fmt.Errorf("egresslane: dial %s via %s: %w", target, bastionID, ctx.Err())
	}
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("egresslane: dial %s via %s: %w", target, bastionID, err)
	}
	if !v.OK {
		_ = conn.Close()
		return nil, &RefusedError{Reason: v.Reason}
	}
	return conn, nil
}

// exchange sends the job and reads the verdict.
func exchange(conn net.Conn, target string) (verdict, error) {
	if err := writeLine(conn, job{V: 1, Target: target}); err != nil {
		return verdict{}, err
	}
	line, err := readLine(conn)
	if err != nil {
		return verdict{}, err
	}
	return decodeVerdict(line)
}

// take removes one live parked worker of id, the most recently parked
// first (the least likely to have been cut by a NAT), waiting for one
// until ctx ends.
func (d *Dispatcher) take(ctx context.Context, id string) (net.Conn, error) {
	for {
		d.mu.Lock()
		if q := d.parked[id]; len(q) > 0 {
			p := q[len(q)-1]
			d.parked[id] = q[:len(q)-1]
			if len(d.parked[id]) == 0 {
				delete(d.parked, id)
			}
			p.taken = true
			d.mu.Unlock()
			if conn := claim(p); conn != nil {
				return conn, nil
			}
			continue
		}
		w := d.wake[id]
		if w == nil {
			w = make(chan struct{})
			d.wake[id] = w
		}
		d.mu.Unlock()
		select {
		case <-w:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w for bastion %s: %w", ErrNoWorker, id, ctx.Err())
		}
	}
}

// claim stops p's watcher and returns its connection, or nil (closed) when
// the worker hung up or spoke while parked.
func claim(p *parkedConn) net.Conn {
	_ = p.conn.SetReadDeadline(time.Unix(1, 0))
	<-p.done
	if p.spoke || p.conn.SetReadDeadline(time.Time{}) != nil {
		_ = p.conn.Close()
		return nil
	}
	return p.conn
}
