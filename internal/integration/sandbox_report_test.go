package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"testing"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/daemon/sandbox"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// reportSession is a session opened with a node's own identity (its
// daemon stopped), on which a test sends sandbox reports of its making.
type reportSession struct {
	t      *testing.T
	stream nodev1.Gateway_SessionClient
}

func openReportSession(t *testing.T, n *testenv.Node) *reportSession {
	t.Helper()
	n.Stop()
	conn, err := n.Dial()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); conn.Close() })
	stream, err := nodev1.NewGatewayClient(conn).Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Hello{Hello: &nodev1.Hello{NodeId: n.NodeID(), BootId: "b-report-test"}}}); err != nil {
		t.Fatal(err)
	}
	if m, err := stream.Recv(); err != nil || m.GetWelcome() == nil {
		t.Fatalf("welcome: %v %v", m, err)
	}
	return &reportSession{t: t, stream: stream}
}

// send sends r then a ping, and reports whether r was acknowledged: the
// gateway handles a session's messages in order, so an ack comes before
// the ping's answer or not at all.
func (s *reportSession) send(r *nodev1.SandboxReport) bool {
	s.t.Helper()
	if err := s.stream.Send(&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_SandboxReport{SandboxReport: r}}); err != nil {
		s.t.Fatal(err)
	}
	if err := s.stream.Send(&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Ping{Ping: &nodev1.Ping{}}}); err != nil {
		s.t.Fatal(err)
	}
	acked := false
	for {
		m, err := s.stream.Recv()
		if err != nil {
			s.t.Fatalf("session: %v", err)
		}
		switch a := m.Msg.(type) {
		case *nodev1.ServerMessage_SandboxAck:
			// The ack names the report it acknowledges by its body's
			// digest (the node forgets only that report).
			if d := sha256.Sum256(r.Body); !bytes.Equal(a.SandboxAck.GetBodySha256(), d[:]) {
				s.t.Fatalf("the ack names body digest %x, want %x", a.SandboxAck.GetBodySha256(), d)
			}
			acked = true
		case *nodev1.ServerMessage_Ping:
			return acked
		}
	}
}

// TestSandboxReportRefused: the control plane acts on a node's sandbox
// report only when the node hosts the sandbox and the report is signed by
// its key. A report naming another node's sandbox or an unknown id, one
// whose body names another node, and one with a bad signature are each
// refused (recorded with their reason), unacknowledged, and change
// nothing; the host's own signed report then marks the sandbox failed.
func TestSandboxReportRefused(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 2, SandboxRuntime: spec.RuntimeSim})
		tenant, admin := e.TenantAdmin(t, "acme")
		ctx := context.Background()
		if _, err := e.CP.Sandboxes.ImportBytes(ctx, audit.Entry{TenantID: tenant, Actor: "test"}, tenant, "busybox", busyboxTar(t)); err != nil {
			t.Fatal(err)
		}
		if err := admin.Call(ctx, "templates.create", map[string]any{"name": "small", "image": "busybox", "runtime": spec.RuntimeSim}, nil); err != nil {
			t.Fatal(err)
		}
		x, err := admin.CreateSandbox(ctx, "", "small")
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		host, other := e.Nodes[0], e.Nodes[1]
		if x.NodeID != host.NodeID() {
			host, other = other, host
		}
		body := func(id, node string) *nodev1.SandboxReportBody {
			return &nodev1.SandboxReportBody{SandboxId: id, NodeId: node, State: sandboxes.StateFailed, Reason: sandbox.ReasonRuntimeDied, AtMs: 1}
		}
		unchanged := func(what string) {
			t.Helper()
			got, err := admin.Sandbox(ctx, x.ID)
			if err != nil || got.State != sandboxes.StateRunning || got.Reason != "" {
				t.Fatalf("after %s: %+v %v, want running", what, got, err)
			}
		}
		refused := func(what string, s *reportSession, r *nodev1.SandboxReport, reason string) {
			t.Helper()
			if s.send(r) {
				t.Fatalf("%s: acknowledged", what)
			}
			unchanged(what)
			if !hasReason(t, e, sandboxes.EventReportRefused, reason) {
				t.Fatalf("%s: no %s event with reason %s", what, sandboxes.EventReportRefused, reason)
			}
		}
		sign := func(n *testenv.Node, b *nodev1.SandboxReportBody) *nodev1.SandboxReport {
			t.Helper()
			r, err := n.SignReport(b)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}

		others := openReportSession(t, other)
		refused("another node's sandbox", others, sign(other, body(x.ID, other.NodeID())), "sandbox-other-node")
		refused("an unknown sandbox", others, sign(other, body("sbx-unknown", other.NodeID())), "sandbox-unknown")
		refused("a body naming the host", others, sign(other, body(x.ID, host.NodeID())), "report-other-node")

		hs := openReportSession(t, host)
		bad := sign(host, body(x.ID, host.NodeID()))
		bad.NodeSig[len(bad.NodeSig)/2] ^= 0xff
		refused("a bad signature", hs, bad, "bad-signature")
		forged := sign(other, body(x.ID, host.NodeID()))
		forged.CertSerial = host.Serial()
		refused("another node's key", hs, forged, "bad-signature")
		var audited int
		if err := e.CP.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit_events WHERE action = $1`, "compute:sandboxes:failed").Scan(&audited); err != nil || audited != 0 {
			t.Fatalf("failure audit rows after refusals: %d %v, want 0", audited, err)
		}

		if !hs.send(sign(host, body(x.ID, host.NodeID()))) {
			t.Fatal("the host's own report was not acknowledged")
		}
		got, err := admin.Sandbox(ctx, x.ID)
		if err != nil || got.State != sandboxes.StateFailed || got.Reason != sandbox.ReasonRuntimeDied {
			t.Fatalf("after the host's report: %+v %v, want failed (runtime-died)", got, err)
		}
		if err := e.CP.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit_events WHERE tenant_id = $1 AND action = $2 AND resource = $3`,
			tenant, "compute:sandboxes:failed", "sandbox/"+x.ID).Scan(&audited); err != nil || audited != 1 {
			t.Fatalf("failure audit rows in the tenant: %d %v, want 1", audited, err)
		}
	})
}

// TestSandboxReportSentAfterReconnect: a report the host makes while its
// node has no session is kept and sent when the session comes up, and the
// control plane's ack clears it.
func TestSandboxReportSentAfterReconnect(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Nodes: 1, SandboxRuntime: spec.RuntimeSim})
	tenant, admin := e.TenantAdmin(t, "acme")
	ctx := context.Background()
	if _, err := e.CP.Sandboxes.ImportBytes(ctx, audit.Entry{TenantID: tenant, Actor: "test"}, tenant, "busybox", busyboxTar(t)); err != nil {
		t.Fatal(err)
	}
	if err := admin.Call(ctx, "templates.create", map[string]any{"name": "small", "image": "busybox", "runtime": spec.RuntimeSim}, nil); err != nil {
		t.Fatal(err)
	}
	x, err := admin.CreateSandbox(ctx, "", "small")
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	n := e.Nodes[0]
	n.Stop()
	n2 := e.OpenNode(t, n.Dir, "")
	n2.ReportSandboxFailed(x.ID, sandbox.ReasonRuntimeDied)
	if got, err := admin.Sandbox(ctx, x.ID); err != nil || got.State != sandboxes.StateRunning {
		t.Fatalf("before the session: %+v %v, want running", got, err)
	}
	n2.Start(t)
	pollUntil(t, "the sandbox failed", func() bool {
		got, err := admin.Sandbox(ctx, x.ID)
		return err == nil && got.State == sandboxes.StateFailed && got.Reason == sandbox.ReasonRuntimeDied
	})
	pollUntil(t, "the report acknowledged", func() bool { return n2.PendingReports() == 0 })
}
