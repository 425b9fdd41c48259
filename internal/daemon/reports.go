package daemon

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// SandboxFailures is a driver that can tell the node of sandboxes it found
// dead (sandbox.Driver): Open registers the node's report function with it.
type SandboxFailures interface {
	OnSandboxFailed(f func(sandboxID, reason string))
}

// SandboxAdopter is a driver whose sandbox host can adopt the sandboxes
// it found running at open (sandbox.Driver, sandbox.HelperDriver): it
// checks each against the signed commands it kept, verified again (by
// the node's Verifier's CheckKept, or the root helper under its own
// trust), kills those that do not match, and returns the ones it kept;
// the node reports those to the control plane, which confirms each or
// orders it deleted with a signed sandbox.delete. An error means it
// could not adopt yet (the helper needs a desired state): the node asks
// again at Run and at each desired state it takes, until it succeeds.
type SandboxAdopter interface {
	AdoptSandboxes(ctx context.Context, check func(signed []byte, kind string) ([]byte, error)) ([]string, error)
}

// sandboxAdopted is the state of a node's report that its host adopted a
// sandbox after a restart (the control plane's sandboxes.ReportAdopted),
// with reason reasonAdopted.
const (
	sandboxAdopted = "adopted"
	reasonAdopted  = "adopted-at-restart"
)

// AdoptTimeout bounds one adoption of the host's sandboxes (the driver's
// or the root helper's): it runs on the path that takes a desired state.
const AdoptTimeout = time.Minute

// adoption is the node's once-per-process adoption of its sandboxes.
type adoption struct {
	mu   sync.Mutex
	by   SandboxAdopter // nil: the driver hosts no sandboxes
	done bool
}

// adoptSandboxes has the driver adopt what its host found running and
// queues a report of each sandbox it kept, unless that already happened
// in this process; a driver that cannot adopt yet is asked again on the
// next call.
func (n *Node) adoptSandboxes(ctx context.Context) {
	n.adoption.mu.Lock()
	defer n.adoption.mu.Unlock()
	if n.adoption.by == nil || n.adoption.done {
		return
	}
	// A helper or runtime that never answers must not hold the caller
	// (the session taking a desired state) for ever: past the deadline
	// adoption counts as not done and is asked again later.
	ctx, cancel := context.WithTimeout(ctx, AdoptTimeout)
	defer cancel()
	ids, err := n.adoption.by.AdoptSandboxes(ctx, n.verify.CheckKept)
	if err != nil {
		n.cfg.Log.Warn("sandboxes not adopted yet", "err", err)
		return
	}
	n.adoption.done = true
	for _, id := range ids {
		n.queueReport(&nodev1.SandboxReportBody{SandboxId: id, State: sandboxAdopted, Reason: reasonAdopted, AtMs: n.now().UnixMilli()})
	}
	n.cfg.Log.Info("sandboxes adopted, to report", "count", len(ids))
}

// sandboxFailed is the sandbox state a report carries: the only one a node
// reports (the control plane's sandboxes.StateFailed; a sandbox state,
// not a command state).
const sandboxFailed = "failed"

// reports holds the sandbox reports not yet acknowledged by the control
// plane. Each is sent once per session (again after a reconnect) until
// its ack arrives; it lives in memory only, as the host's record of the
// dead sandbox does.
type reports struct {
	mu      sync.Mutex
	pending map[string]*pendingReport
	wake    chan struct{} // poked when a report is added
}

type pendingReport struct {
	body *nodev1.SandboxReportBody
	sent bool // sent on the current session
	// digest is the SHA-256 of the signed body last sent: an ack names
	// it, so an ack of an earlier report for the sandbox forgets nothing.
	digest [sha256.Size]byte
}

func newReports() *reports {
	return &reports{pending: map[string]*pendingReport{}, wake: make(chan struct{}, 1)}
}

// ReportSandboxFailed queues a signed report that sandbox id failed with
// reason and wakes the session to send it.
func (n *Node) ReportSandboxFailed(id, reason string) {
	n.queueReport(&nodev1.SandboxReportBody{SandboxId: id, State: sandboxFailed, Reason: reason, AtMs: n.now().UnixMilli()})
	n.cfg.Log.Info("sandbox failure to report", "sandbox_id", id, "reason", reason)
}

// queueReport queues a report body (replacing one pending for its
// sandbox) and wakes the session to send it.
func (n *Node) queueReport(b *nodev1.SandboxReportBody) {
	n.reports.mu.Lock()
	n.reports.pending[b.SandboxId] = &pendingReport{body: b}
	n.reports.mu.Unlock()
	select {
	case n.reports.wake <- struct{}{}:
	default:
	}
}

// PendingReports returns how many sandbox reports await their ack.
func (n *Node) PendingReports() int {
	n.reports.mu.Lock()
	defer n.reports.mu.Unlock()
	return len(n.reports.pending)
}

// sendReports sends the pending reports not yet sent on this session
// (all of them when fresh, at the start of a session), each signed with
// the current node key.
func (n *Node) sendReports(send func(*nodev1.NodeMessage) error, fresh bool) error {
	n.reports.mu.Lock()
	var todo []*pendingReport
	for _, p := range n.reports.pending {
		if fresh || !p.sent {
			todo = append(todo, p)
		}
	}
	n.reports.mu.Unlock()
	for _, p := range todo {
		r, err := n.signReport(p.body)
		if err != nil {
			return err
		}
		n.reports.mu.Lock()
		p.sent, p.digest = true, sha256.Sum256(r.Body)
		n.reports.mu.Unlock()
		if err := send(&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_SandboxReport{SandboxReport: r}}); err != nil {
			return err
		}
	}
	return nil
}

// ackReport forgets an acknowledged report: the one whose signed body the
// ack names. A report queued for the same sandbox since the acknowledged
// one was sent (an adopted sandbox found dead, say) stays until its own
// ack, whether or not it was sent yet. An ack without a digest (a gateway
// older than the field) acknowledges the sandbox's sent report.
func (n *Node) ackReport(a *nodev1.SandboxReportAck) {
	n.reports.mu.Lock()
	defer n.reports.mu.Unlock()
	p, ok := n.reports.pending[a.GetSandboxId()]
	if !ok || !p.sent {
		return
	}
	if d := a.GetBodySha256(); len(d) != 0 && !bytes.Equal(d, p.digest[:]) {
		return
	}
	delete(n.reports.pending, a.GetSandboxId())
}

// SignReport signs a sandbox report body as the node does before sending
// it (tests forge reports with it).
func (n *Node) SignReport(b *nodev1.SandboxReportBody) (*nodev1.SandboxReport, error) {
	return n.signReport(b)
}

// signReport encodes a report body naming this node and signs it with the
// current node key under wire.SandboxReportSigContext.
func (n *Node) signReport(in *nodev1.SandboxReportBody) (*nodev1.SandboxReport, error) {
	b := proto.Clone(in).(*nodev1.SandboxReportBody)
	if b.NodeId == "" {
		b.NodeId = n.rec.NodeID
	}
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("daemon: encode report: %w", err)
	}
	sig, serial, err := n.sign(wire.SandboxReportSigContext, body)
	if err != nil {
		return nil, fmt.Errorf("daemon: sign report: %w", err)
	}
	return &nodev1.SandboxReport{Body: body, NodeSig: sig, CertSerial: serial}, nil
}
