package egresslane

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/netguard"
)

// Refusal reasons this package gives. netguard's reasons (loopback,
// private, this-machine, ...) are passed through as they are.
const (
	// ReasonNotGranted: the pairing's grants do not hold the egress family.
	ReasonNotGranted = "egress-not-granted"
	// ReasonNotEnabled: the machine's owner has not turned the egress lane
	// on (bcd bastion run --egress), whatever the grants say.
	ReasonNotEnabled = "egress-not-enabled"
	// ReasonMalformedJob: the job line is not a valid job.
	ReasonMalformedJob = "malformed-job"
	// ReasonBusy: MaxActive spliced connections are already live.
	ReasonBusy = "busy"
	// ReasonDialFailed: the target refused the connection or did not answer.
	ReasonDialFailed = "dial-failed"
)

// Event kinds and the lane name written to the audit log.
const (
	// KindAccept: a job was dialled and spliced.
	KindAccept = "accept"
	// KindRefuse: a job was refused with a reason.
	KindRefuse = "refuse"
	// Lane is the lane name every Event carries.
	Lane = "egress"
)

// Defaults for WorkerConfig's zero fields.
const (
	// DefaultWorkers is how many workers stay parked on the CP.
	DefaultWorkers = 2
	// DefaultBackoff is how long a worker waits after a refused job.
	DefaultBackoff = time.Second
	// DefaultMaxActive is how many spliced connections may be live at once.
	DefaultMaxActive = 16
)

// Guard dials a target on someone else's behalf after checking it. In
// production it is a *netguard.Dialer with no Allow exceptions.
type Guard interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// Event is one audit record: a job accepted or refused.
type Event struct {
	// Kind is KindAccept or KindRefuse.
	Kind string
	// Lane is always Lane ("egress").
	Lane string
	// Reason is the refusal reason (empty on accept).
	Reason string
	// Peer is the CP's address as the worker's connection sees it.
	Peer string
	// Detail is the target the CP sent, or for a malformed job why it is
	// malformed. The event reaches the CP (the bastion's event chain), so
	// it never says what a target resolved to on the owner's network: that
	// goes to the owner's log only.
	Detail string
}

// WorkerConfig configures RunWorkers.
type WorkerConfig struct {
	// Dial opens a connection to the CP's egress listener in the tunnel.
	Dial func(ctx context.Context) (net.Conn, error)
	// Guard checks and dials targets: production uses
	// netguard.NewDialer(netguard.Config{}) with no Allow exceptions.
	Guard Guard
	// Enabled is the machine's owner's consent to the lane (bcd bastion run
	// --egress): without it every job is refused egress-not-enabled, so
	// the control plane's signed grants alone never make the owner's
	// machine a relay.
	Enabled bool
	// Allowed reports whether the current grants hold the egress family; it
	// is read for every job.
	Allowed func() bool
	// Clock times the backoff.
	Clock clock.Clock
	// Workers is how many workers stay parked; 0 means DefaultWorkers.
	Workers int
	// Backoff is the wait after a refused, malformed or busy job, a parked
	// connection that ended without a job, and a failed Dial of the CP;
	// 0 means DefaultBackoff.
	Backoff time.Duration
	// MaxActive caps live spliced connections; a job beyond it is refused
	// ReasonBusy. 0 means DefaultMaxActive.
	MaxActive int
	// Audit receives every accepted and refused job; nil drops them.
	Audit func(Event)
	// Log receives operational lines; nil discards them.
	Log *slog.Logger
}

// runner is one RunWorkers call's state.
type runner struct {
	cfg WorkerConfig
	log *slog.Logger
	wg  sync.WaitGroup

	mu     sync.Mutex
	active int // live spliced connections
}

// RunWorkers keeps cfg.Workers workers parked on the CP until ctx ends,
// then closes every parked and spliced connection and returns nil once
// all have ended. It fails at once on an incomplete config.
func RunWorkers(ctx context.Context, cfg WorkerConfig) error {
	if cfg.Dial == nil || cfg.Guard == nil || cfg.Allowed == nil || cfg.Clock == nil {
		return errors.New("egresslane: WorkerConfig needs Dial, Guard, Allowed and Clock")
	}
	if cfg.Workers < 0 || cfg.Backoff < 0 || cfg.MaxActive < 0 {
		return errors.New("egresslane: negative Workers, Backoff or MaxActive")
	}
	if cfg.Workers == 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.Backoff == 0 {
		cfg.Backoff = DefaultBackoff
	}
	if cfg.MaxActive == 0 {
		cfg.MaxActive = DefaultMaxActive
	}
	if cfg.Audit == nil {
		cfg.Audit = func(Event) {}
	}
	r := &runner{cfg: cfg, log: cfg.Log}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	for range cfg.Workers {
		r.wg.Go(func() { r.work(ctx) })
	}
	r.wg.Wait()
	return nil
}

// work parks, serves one job, and parks again: at once after a job it
// took, after Backoff otherwise.
func (r *runner) work(ctx context.Context) {
	for ctx.Err() == nil {
		if r.park(ctx) {
			continue
		}
		t := r.cfg.Clock.NewTimer(r.cfg.Backoff)
		select {
		case <-t.C():
		case <-ctx.Done():
			t.Stop()
		}
	}
}

// park opens one connection to the CP, says hello, waits for a job and
// serves it. It reports whether the job was taken (dialled and spliced).
func (r *runner) park(ctx context.Context) bool {
	conn, err := r.cfg.Dial(ctx)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("egress worker cannot reach the control plane", "err", err)
		}
		return false
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	took := false
	defer func() {
		stop()
		if !took {
			_ = conn.Close()
		}
	}()
	if err := writeLine(conn, hello{V: 1}); err != nil {
		r.log.Warn("egress worker hello failed", "err", err)
		return false
	}
	line, err := readLine(conn)
	if errors.Is(err, ErrLineTooLong) {
		r.refuse(conn, ReasonMalformedJob, err.Error())
		return false
	}
	if err != nil {
		if ctx.Err() == nil {
			r.log.Info("egress worker parked connection ended without a job", "err", err)
		}
		return false
	}
	took = r.serve(ctx, conn, line)
	return took
}

// serve judges one job line and either refuses it or dials the target and
// hands both connections to a splice. It reports whether it took the job.
func (r *runner) serve(ctx context.Context, conn net.Conn, line []byte) bool {
	target, err := decodeJob(line)
	if err != nil {
		r.refuse(conn, ReasonMalformedJob, err.Error())
		return false
	}
	if !r.cfg.Enabled {
		r.refuse(conn, ReasonNotEnabled, target)
		return false
	}
	if !r.cfg.Allowed() {
		r.refuse(conn, ReasonNotGranted, target)
		return false
	}
	if !r.reserve() {
		r.refuse(conn, ReasonBusy, target)
		return false
	}
	out, err := r.cfg.Guard.DialContext(ctx, "tcp", target)
	if err != nil {
		r.release()
		r.log.Info("egress target refused by the guard", "target", target, "err", err)
		r.refuse(conn, guardReason(err), target)
		return false
	}
	r.cfg.Audit(Event{Kind: KindAccept, Lane: Lane, Peer: peer(conn), Detail: target})
	r.log.Info("egress job accepted", "target", target, "peer", peer(conn))
	if err := writeLine(conn, verdict{OK: true}); err != nil {
		r.release()
		_ = out.Close()
		r.log.Warn("egress worker verdict failed", "err", err)
		return false
	}
	r.wg.Go(func() {
		defer r.release()
		splice(ctx, conn, out)
	})
	return true
}

// guardReason maps a Guard error to the reason sent to the CP: netguard's
// own reason for a refusal, malformed-job for a target netguard cannot
// parse, dial-failed for anything else.
func guardReason(err error) string {
	var re *netguard.RefusedError
	switch {
	case errors.As(err, &re):
		return string(re.Reason)
	case errors.Is(err, netguard.ErrBadTarget):
		return ReasonMalformedJob
	}
	return ReasonDialFailed
}

// refuse audits and logs a refusal, then sends its verdict (best effort).
// The audit comes first, so the record exists before the CP learns of it.
func (r *runner) refuse(conn net.Conn, reason, detail string) {
	r.cfg.Audit(Event{Kind: KindRefuse, Lane: Lane, Reason: reason, Peer: peer(conn), Detail: detail})
	r.log.Info("egress job refused", "reason", reason, "peer", peer(conn), "detail", detail)
	if err := writeLine(conn, verdict{Reason: reason}); err != nil {
		r.log.Warn("egress worker verdict failed", "err", err)
	}
}

// reserve takes one of MaxActive slots; false when none is free.
func (r *runner) reserve() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.active >= r.cfg.MaxActive {
		return false
	}
	r.active++
	return true
}

func (r *runner) release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.active--
}

func peer(c net.Conn) string {
	if a := c.RemoteAddr(); a != nil {
		return a.String()
	}
	return ""
}

// splice copies bytes both ways until both directions end, passing a
// clean end on as a half-close, and closes both connections; ctx's end
// closes them at once.
func splice(ctx context.Context, a, b net.Conn) {
	closeBoth := func() { _ = a.Close(); _ = b.Close() }
	stop := context.AfterFunc(ctx, closeBoth)
	defer stop()
	defer closeBoth()
	var wg sync.WaitGroup
	wg.Go(func() { copyHalf(b, a, closeBoth) })
	copyHalf(a, b, closeBoth)
	wg.Wait()
}

// copyHalf copies src to dst; at src's clean end it half-closes dst, on an
// error it closes both sides so the other direction ends too.
func copyHalf(dst, src net.Conn, closeBoth func()) {
	if _, err := io.Copy(dst, src); err != nil {
		closeBoth()
		return
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		if cw.CloseWrite() == nil {
			return
		}
	}
	closeBoth()
}
