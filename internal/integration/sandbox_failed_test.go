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
	"github.com/bettercompute/bettercompute/internal/sandboxes"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// TestSandboxRunscDeadIsFailed kills a gVisor sandbox's kernel from the
// host (as the memory or pids limit does): the host's sweep removes the
// dead sandbox, the tenant's next exec fails, and the control plane then
// shows the sandbox failed (reason sandbox-failed) rather than running
// until its deadline.
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
	deadline := time.Now().Add(30 * time.Second)
	for {
		n.Sandbox.Sweep(ctx)
		if _, ok := n.Sandbox.Get(x.ID); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the host still holds the dead sandbox")
		}
		<-time.After(50 * time.Millisecond) // poll interval
	}
	if _, err := admin.Exec(ctx, x.ID, []string{"true"}, 5); err == nil {
		t.Fatal("exec in a dead sandbox succeeded")
	}
	got, err := admin.Sandbox(ctx, x.ID)
	if err != nil || got.State != sandboxes.StateFailed || got.Reason != "sandbox-failed" {
		t.Fatalf("after its death: %+v %v, want failed (sandbox-failed)", got, err)
	}
}
