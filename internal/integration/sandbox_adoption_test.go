package integration

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/daemon/sandbox"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// TestSandboxAdoptionAfterBcdRestart stops a node's bcd with four runc
// sandboxes running and, while it is down, has the control plane forget
// one (its row gone, as after a restore from an earlier backup, so no
// delete is ever sent), loses another's state file, and extends a third's
// deadline in its state file. bcd then opens again on the same data
// folder: the sandbox the control plane still records is adopted, keeps
// its processes and files and answers exec; the one with no state is
// killed at once (unknown-to-host), the tampered one too (its state no
// longer matches the signed commands it keeps: spec-unmatched), and both
// are failed in the control plane with those reasons; the forgotten one
// is reported adopted, and the control plane answers with a signed
// sandbox.delete, audited, after which the runtime holds it no more.
func TestSandboxAdoptionAfterBcdRestart(t *testing.T) {
	if sandboxRuntime(t) != spec.RuntimeRunc {
		t.Skip("RUNC TEST NOT RUN: needs runc, root and busybox-static")
	}
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Nodes: 1, SandboxRuntime: spec.RuntimeRunc})
	tenant, admin := e.TenantAdmin(t, "acme")
	ctx := context.Background()
	if _, err := e.CP.Sandboxes.ImportBytes(ctx, audit.Entry{TenantID: tenant, Actor: "test"}, tenant, "busybox", busyboxTar(t)); err != nil {
		t.Fatal(err)
	}
	if err := admin.Call(ctx, "templates.create", map[string]any{"name": "small", "image": "busybox", "runtime": spec.RuntimeRunc,
		"limits": map[string]any{"cpu_millis": 500, "memory_mb": 128, "pids": 64, "disk_mb": 32}}, nil); err != nil {
		t.Fatal(err)
	}
	var kept, forgotten, unknown, tampered string
	for _, p := range []*string{&kept, &forgotten, &unknown, &tampered} {
		x, err := admin.CreateSandbox(ctx, "", "small")
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		*p = x.ID
	}
	if r, err := admin.Exec(ctx, kept, []string{"sh", "-c", "echo adopted > /tmp/mark"}, 10); err != nil || r.ExitCode != 0 {
		t.Fatalf("write: %+v %v", r, err)
	}

	n := e.Nodes[0]
	n.Stop()
	if _, err := e.CP.DB.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = $1`, forgotten); err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(n.Dir, "sandbox", "state")
	if err := os.Remove(filepath.Join(stateDir, unknown+".json")); err != nil {
		t.Fatal(err)
	}
	extendDeadline(t, filepath.Join(stateDir, tampered+".json"))

	n2 := e.OpenNode(t, n.Dir, "")
	// Adoption ran in Open, before any session: the host's own rules.
	for _, id := range []string{unknown, tampered} {
		if _, ok := n2.Sandbox.Get(id); ok {
			t.Fatalf("%s still held after open", id)
		}
	}
	if _, ok := n2.Sandbox.Get(kept); !ok {
		t.Fatal("the known sandbox was not adopted")
	}
	n2.Start(t)
	n2.WaitConnected(t)
	pollUntil(t, "the forgotten sandbox deleted on the control plane's signed order", func() bool {
		_, held := n2.Sandbox.Get(forgotten)
		return !held
	})
	pollUntil(t, "the node's reports acknowledged", func() bool { return n2.PendingReports() == 0 })

	left := runcInstances(t, n.Dir)
	if !slices.Contains(left, kept) || slices.Contains(left, forgotten) || slices.Contains(left, unknown) || slices.Contains(left, tampered) {
		t.Fatalf("runc holds %v; want %s and none of %s %s %s", left, kept, forgotten, unknown, tampered)
	}
	if r, err := admin.Exec(ctx, kept, []string{"cat", "/tmp/mark"}, 10); err != nil || string(r.Stdout) != "adopted\n" {
		t.Fatalf("exec in the adopted sandbox: %+v %v", r, err)
	}
	for id, want := range map[string]string{kept: "", unknown: sandbox.ReasonUnknownToHost, tampered: sandbox.ReasonSpecUnmatched} {
		got, err := admin.Sandbox(ctx, id)
		wantState := sandboxes.StateFailed
		if want == "" {
			wantState = sandboxes.StateRunning
		}
		if err != nil || got.State != wantState || got.Reason != want {
			t.Fatalf("%s: %+v %v, want %s %q", id, got, err, wantState, want)
		}
	}
	var audited int
	if err := e.CP.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit_events WHERE action = $1 AND resource = $2`,
		"compute:sandboxes:adoption-kill", "sandbox/"+forgotten).Scan(&audited); err != nil || audited != 1 {
		t.Fatalf("adoption-kill audit rows: %d %v, want 1", audited, err)
	}
}

// extendDeadline moves the deadline in a sandbox's state file an hour
// later, as someone with write access to the host's data folder might.
func extendDeadline(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var st map[string]any
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	st["deadline_ms"] = st["deadline_ms"].(float64) + 3600e3
	if b, err = json.Marshal(st); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// runcInstances lists what the node's runc holds: its containers and the
// bundles the host keeps.
func runcInstances(t *testing.T, nodeDir string) []string {
	t.Helper()
	bin, err := exec.LookPath("runc")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(nodeDir, "sandbox")
	rt, err := sandbox.NewOCI(spec.RuntimeRunc, bin, sandbox.RuntimeDir(dir, spec.RuntimeRunc, []string{spec.RuntimeRunc}))
	if err != nil {
		t.Fatal(err)
	}
	ids, err := rt.Instances(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestSandboxAdoptedReportOrdersOnlyTheReporter: a node's adopted report
// can only ever have the control plane order that same node to delete:
// a node claiming another node's live sandbox gets a signed
// sandbox.delete addressed to itself, while the sandbox keeps running on
// its host and no command reaches the host; the host's own adopted
// report is confirmed with no delete; a report with a bad signature or
// a malformed sandbox id is refused by reason and queues nothing.
func TestSandboxAdoptedReportOrdersOnlyTheReporter(t *testing.T) {
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
		adopted := func(n *testenv.Node, id string) *nodev1.SandboxReport {
			t.Helper()
			r, err := n.SignReport(&nodev1.SandboxReportBody{SandboxId: id, NodeId: n.NodeID(), State: sandboxes.ReportAdopted, Reason: "adopted-at-restart", AtMs: 1})
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		deletes := func(n *testenv.Node) int {
			t.Helper()
			var c int
			if err := e.CP.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM commands WHERE node_id = $1 AND kind = $2`, n.NodeID(), kinds.SandboxDelete).Scan(&c); err != nil {
				t.Fatal(err)
			}
			return c
		}
		running := func(what string) {
			t.Helper()
			got, err := admin.Sandbox(ctx, x.ID)
			if err != nil || got.State != sandboxes.StateRunning {
				t.Fatalf("after %s: %+v %v, want running", what, got, err)
			}
		}

		others := openReportSession(t, other)
		if !others.send(adopted(other, x.ID)) {
			t.Fatal("another node's adopted report was not answered")
		}
		running("another node's adopted report")
		if deletes(other) != 1 || deletes(host) != 0 {
			t.Fatalf("deletes: %d to the reporter, %d to the host; want 1 and 0", deletes(other), deletes(host))
		}
		if others.send(adopted(other, "sbx-unknown")) || !hasReason(t, e, sandboxes.EventReportRefused, "report-malformed") {
			t.Fatal("a malformed sandbox id was not refused report-malformed")
		}

		hs := openReportSession(t, host)
		bad := adopted(host, x.ID)
		bad.NodeSig[len(bad.NodeSig)/2] ^= 0xff
		if hs.send(bad) || !hasReason(t, e, sandboxes.EventReportRefused, "bad-signature") {
			t.Fatal("an adopted report with a bad signature was not refused bad-signature")
		}
		if !hs.send(adopted(host, x.ID)) {
			t.Fatal("the host's own adopted report was not confirmed")
		}
		running("the host's adopted report")
		if deletes(host) != 0 || deletes(other) != 1 {
			t.Fatalf("deletes after confirmation: %d to the host, %d to the other; want 0 and 1", deletes(host), deletes(other))
		}
	})
}

// TestSandboxAdoptedReportsAreRateLimited: one node's adopted reports
// can have at most AdoptKillsPerMinute deletes queued a minute (a node,
// or a gateway replaying its signed reports, cannot grow the commands
// table without bound); a report past it is not acknowledged, so the
// node sends it again later. The clock stands still: no refill.
func TestSandboxAdoptedReportsAreRateLimited(t *testing.T) {
	clk := clock.NewFake(time.Now())
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Nodes: 1, SandboxRuntime: spec.RuntimeSim, Clock: clk})
	ctx := context.Background()
	n := e.Nodes[0]
	r, err := n.SignReport(&nodev1.SandboxReportBody{SandboxId: ids.New("sbx"), NodeId: n.NodeID(), State: sandboxes.ReportAdopted, Reason: "adopted-at-restart", AtMs: 1})
	if err != nil {
		t.Fatal(err)
	}
	s := openReportSession(t, n)
	for i := 0; i < sandboxes.AdoptKillsPerMinute; i++ {
		if !s.send(r) {
			t.Fatalf("adopted report %d within the rate was not acknowledged", i+1)
		}
	}
	if s.send(r) {
		t.Fatal("an adopted report past the rate was acknowledged")
	}
	var c int
	if err := e.CP.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM commands WHERE node_id = $1 AND kind = $2`, n.NodeID(), kinds.SandboxDelete).Scan(&c); err != nil {
		t.Fatal(err)
	}
	if c != sandboxes.AdoptKillsPerMinute {
		t.Fatalf("%d deletes queued, want %d", c, sandboxes.AdoptKillsPerMinute)
	}
}
