package integration

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/daemon/sandbox"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// TestSandboxRunscDeadIsFailed kills a gVisor sandbox's kernel from the
// host (as the memory or pids limit does): the host's sweep removes the
// dead sandbox and its node reports it, so that sandboxes.get shows it
// failed (reason runtime-died) within 5 s, with no exec, rather than
// running until its deadline; the failure is audited in the tenant.
func TestSandboxRunscDeadIsFailed(t *testing.T) {
	requireRunscOr(t)
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Nodes: 1, SandboxRuntime: spec.RuntimeRunsc})
	tenant, admin := e.TenantAdmin(t, "acme")
	ctx := context.Background()
	if _, err := e.CP.Sandboxes.ImportBytes(ctx, audit.Entry{TenantID: tenant, Actor: "test"}, tenant, "busybox", busyboxTar(t)); err != nil {
		t.Fatal(err)
	}
	if err := admin.Call(ctx, "templates.create", map[string]any{"name": "gvisor", "image": "busybox", "runtime": spec.RuntimeRunsc,
		"limits": map[string]any{"cpu_millis": 500, "memory_mb": 128, "pids": 512, "disk_mb": 32}}, nil); err != nil {
		t.Fatal(err)
	}
	x, err := admin.CreateSandbox(ctx, "", "gvisor")
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	n := e.Nodes[0]
	b, err := os.ReadFile(filepath.Join(n.Dir, "sandbox", "rt", "bundles", x.ID, "init.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// No exec: the host's sweep (every second in bcd; run here by the
	// poll) finds the runtime dead and the node reports it on its session.
	deadline := time.Now().Add(5 * time.Second)
	for {
		n.Sandbox.Sweep(ctx)
		got, err := admin.Sandbox(ctx, x.ID)
		if err != nil {
			t.Fatalf("sandboxes.get: %v", err)
		}
		if got.State == sandboxes.StateFailed {
			if got.Reason != sandbox.ReasonRuntimeDied {
				t.Fatalf("failed with reason %q, want %q", got.Reason, sandbox.ReasonRuntimeDied)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after its kernel was killed the sandbox shows %s, want failed", got.State)
		}
		<-time.After(50 * time.Millisecond) // poll interval
	}
	if _, ok := n.Sandbox.Get(x.ID); ok {
		t.Fatal("the host still holds the dead sandbox")
	}
	pollUntil(t, "the node's report acknowledged", func() bool { return n.PendingReports() == 0 })
	var audited int
	if err := e.CP.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit_events WHERE tenant_id = $1 AND action = $2 AND resource = $3`,
		tenant, "compute:sandboxes:failed", "sandbox/"+x.ID).Scan(&audited); err != nil || audited != 1 {
		t.Fatalf("audit rows of the failure in the tenant: %d %v, want 1", audited, err)
	}
}
