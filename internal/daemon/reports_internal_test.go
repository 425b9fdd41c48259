package daemon

import (
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// TestReportsResentOnNewSession: a pending sandbox report is sent once per
// session until acknowledged (again on a new session, not again on the
// same one), and its signature is over the report context, not the
// update context.
func TestReportsResentOnNewSession(t *testing.T) {
	key, err := pki.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	n := &Node{cfg: Config{Clock: clock.Real{}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}, rec: &JoinRecord{NodeID: "n-1"}, key: key,
		chain: []*x509.Certificate{{SerialNumber: big.NewInt(7)}}, reports: newReports()}
	var sent []*nodev1.SandboxReport
	send := func(m *nodev1.NodeMessage) error {
		sent = append(sent, m.GetSandboxReport())
		return nil
	}
	n.ReportSandboxFailed("sbx-1", "runtime-died")
	if err := n.sendReports(send, false); err != nil || len(sent) != 1 {
		t.Fatalf("first send: %d sent, %v", len(sent), err)
	}
	if err := n.sendReports(send, false); err != nil || len(sent) != 1 {
		t.Fatalf("same session: %d sent, want still 1 (%v)", len(sent), err)
	}
	if err := n.sendReports(send, true); err != nil || len(sent) != 2 {
		t.Fatalf("new session: %d sent, want 2 (%v)", len(sent), err)
	}
	n.ackReport(&nodev1.SandboxReportAck{SandboxId: "sbx-1"})
	if err := n.sendReports(send, true); err != nil || len(sent) != 2 || n.PendingReports() != 0 {
		t.Fatalf("after the ack: %d sent, %d pending (%v)", len(sent), n.PendingReports(), err)
	}
	r := sent[0]
	var b nodev1.SandboxReportBody
	if err := proto.Unmarshal(r.Body, &b); err != nil || b.NodeId != "n-1" || b.SandboxId != "sbx-1" || b.State != "failed" || b.Reason != "runtime-died" {
		t.Fatalf("report body %+v %v", &b, err)
	}
	pub := &key.PublicKey
	d := sha256.Sum256(append([]byte(wire.SandboxReportSigContext), r.Body...))
	if !ecdsa.VerifyASN1(pub, d[:], r.NodeSig) {
		t.Fatal("the report's signature does not verify under the report context")
	}
	d = sha256.Sum256(append([]byte(wire.UpdateSigContext), r.Body...))
	if ecdsa.VerifyASN1(pub, d[:], r.NodeSig) {
		t.Fatal("the report's signature verifies as an update's")
	}
}

// TestAckKeepsAReportQueuedSinceSent: a failure report queued for a
// sandbox after its adopted report was sent survives that report's ack
// and is sent next; its own ack then clears it.
func TestAckKeepsAReportQueuedSinceSent(t *testing.T) {
	key, err := pki.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	n := &Node{cfg: Config{Clock: clock.Real{}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}, rec: &JoinRecord{NodeID: "n-1"}, key: key,
		chain: []*x509.Certificate{{SerialNumber: big.NewInt(7)}}, reports: newReports()}
	var sent []string
	send := func(m *nodev1.NodeMessage) error {
		var b nodev1.SandboxReportBody
		_ = proto.Unmarshal(m.GetSandboxReport().GetBody(), &b)
		sent = append(sent, b.State)
		return nil
	}
	n.queueReport(&nodev1.SandboxReportBody{SandboxId: "sbx-1", State: sandboxAdopted, Reason: reasonAdopted})
	if err := n.sendReports(send, true); err != nil {
		t.Fatal(err)
	}
	n.ReportSandboxFailed("sbx-1", "runtime-died")
	n.ackReport(&nodev1.SandboxReportAck{SandboxId: "sbx-1"}) // the adopted report's
	if err := n.sendReports(send, false); err != nil || len(sent) != 2 || sent[1] != sandboxFailed {
		t.Fatalf("sent %v (%v), want the failure after the adopted report", sent, err)
	}
	n.ackReport(&nodev1.SandboxReportAck{SandboxId: "sbx-1"})
	if n.PendingReports() != 0 {
		t.Fatalf("%d pending after the failure's ack", n.PendingReports())
	}
}

// TestLateAckKeepsALaterSentReport: a failure report queued and sent for
// a sandbox before the ack of its earlier (adopted) report arrived
// survives that late ack, which names the earlier report's body, and is
// forgotten only by its own ack.
func TestLateAckKeepsALaterSentReport(t *testing.T) {
	key, err := pki.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	n := &Node{cfg: Config{Clock: clock.Real{}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}, rec: &JoinRecord{NodeID: "n-1"}, key: key,
		chain: []*x509.Certificate{{SerialNumber: big.NewInt(7)}}, reports: newReports()}
	var bodies [][]byte
	send := func(m *nodev1.NodeMessage) error {
		bodies = append(bodies, m.GetSandboxReport().GetBody())
		return nil
	}
	ackOf := func(body []byte) *nodev1.SandboxReportAck {
		d := sha256.Sum256(body)
		return &nodev1.SandboxReportAck{SandboxId: "sbx-1", BodySha256: d[:]}
	}
	n.queueReport(&nodev1.SandboxReportBody{SandboxId: "sbx-1", State: sandboxAdopted, Reason: reasonAdopted, AtMs: 1})
	if err := n.sendReports(send, true); err != nil {
		t.Fatal(err)
	}
	n.ReportSandboxFailed("sbx-1", "runtime-died")
	if err := n.sendReports(send, false); err != nil || len(bodies) != 2 {
		t.Fatalf("sent %d (%v), want the adopted report and the failure", len(bodies), err)
	}
	n.ackReport(ackOf(bodies[0])) // the adopted report's, arriving late
	if n.PendingReports() != 1 {
		t.Fatalf("%d pending after the adopted report's late ack, want the failure still pending", n.PendingReports())
	}
	if err := n.sendReports(send, true); err != nil || len(bodies) != 3 || string(bodies[2]) != string(bodies[1]) {
		t.Fatalf("new session: sent %d (%v), want the failure again", len(bodies), err)
	}
	n.ackReport(ackOf(bodies[1]))
	if n.PendingReports() != 0 {
		t.Fatalf("%d pending after the failure's own ack", n.PendingReports())
	}
}

// adopterNeedingIntent is a sandbox driver that, like the root helper's,
// adopts only once the node has a desired state to send.
type adopterNeedingIntent struct {
	*driver.Sim
	intent func() []byte
	calls  int
}

func (a *adopterNeedingIntent) AdoptSandboxes(ctx context.Context, _ func([]byte, string) ([]byte, error)) ([]string, error) {
	a.calls++
	// Every adoption has a deadline: a helper that never answers holds
	// the session for AdoptTimeout at most.
	if d, ok := ctx.Deadline(); !ok || time.Until(d) > AdoptTimeout {
		return nil, errors.New("adoption without a deadline")
	}
	if a.intent == nil || len(a.intent()) == 0 {
		return nil, errors.New("no desired state yet")
	}
	return []string{"sbx-adopted"}, nil
}

// TestAdoptionWaitsForADesiredState: a driver that cannot adopt at Open
// (the helper needs a desired state) is asked again when the node takes
// one, its adopted sandboxes are then queued as adopted reports, and it
// is not asked again in this process.
func TestAdoptionWaitsForADesiredState(t *testing.T) {
	f := newFixture(t)
	n0, _, _ := openTestNode(t, f, 0)
	n0.Close()
	a := &adopterNeedingIntent{Sim: driver.NewSim("n1")}
	n, err := Open(Config{DataDir: n0.cfg.DataDir, Driver: a, Clock: clock.NewFake(f.now), Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	a.intent = n.Intent
	if a.calls != 1 || n.PendingReports() != 0 {
		t.Fatalf("at Open: %d calls, %d reports", a.calls, n.PendingReports())
	}
	sign := intentSigner(t, f)
	deliverIntent(t, n, sign("n1", 1, nil))
	deliverIntent(t, n, sign("n1", 2, nil))
	if a.calls != 2 || n.PendingReports() != 1 {
		t.Fatalf("after desired states: %d calls, %d reports; want 2 and 1", a.calls, n.PendingReports())
	}
	n.reports.mu.Lock()
	p := n.reports.pending["sbx-adopted"]
	n.reports.mu.Unlock()
	if p == nil || p.body.State != sandboxAdopted || p.body.Reason != reasonAdopted {
		t.Fatalf("pending report %+v", p)
	}
}
