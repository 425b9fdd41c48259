package integration

import (
	"context"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// TestSandboxRuncAndRunscOnOneHost: one node runs runc and runsc side by
// side and advertises both; a template on each runtime places its
// sandbox on that one node, each on its own runtime (runc's on the
// host's kernel, runsc's on gVisor's), and both delete. It needs runc,
// runsc and root, and skips loudly without them (BC_REQUIRE_RUNC=1 or
// BC_REQUIRE_RUNSC=1 makes that a failure).
func TestSandboxRuncAndRunscOnOneHost(t *testing.T) {
	requireRunscOr(t)
	if sandboxRuntime(t) != spec.RuntimeRunc {
		t.Skip("RUNC TEST NOT RUN: needs runc, root and busybox-static")
	}
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Nodes: 1, SandboxRuntime: "runc,runsc"})
	host := e.Nodes[0].Sandbox
	for _, rt := range []string{spec.RuntimeRunc, spec.RuntimeRunsc} {
		if host.Labels()[spec.RuntimeLabel(rt)] != "true" {
			t.Fatalf("the node's labels %v lack %s", host.Labels(), rt)
		}
	}
	tenant, admin := e.TenantAdmin(t, "acme")
	ctx := context.Background()
	if _, err := e.CP.Sandboxes.ImportBytes(ctx, audit.Entry{TenantID: tenant, Actor: "test"}, tenant, "busybox", busyboxTar(t)); err != nil {
		t.Fatal(err)
	}
	// gVisor's ptrace platform needs room for its own threads.
	pids := map[string]int{spec.RuntimeRunc: 64, spec.RuntimeRunsc: 1024}
	ids := map[string]string{}
	for _, rt := range []string{spec.RuntimeRunc, spec.RuntimeRunsc} {
		if err := admin.Call(ctx, "templates.create", map[string]any{"name": "on-" + rt, "image": "busybox", "runtime": rt,
			"limits": map[string]any{"cpu_millis": 500, "memory_mb": 128, "pids": pids[rt], "disk_mb": 32}}, nil); err != nil {
			t.Fatal(err)
		}
		x, err := admin.CreateSandbox(ctx, "", "on-"+rt)
		if err != nil {
			t.Fatalf("create on %s: %v", rt, err)
		}
		if x.Runtime != rt || x.NodeID != e.Nodes[0].NodeID() {
			t.Fatalf("sandbox %s on runtime %s, node %s; want %s on %s", x.ID, x.Runtime, x.NodeID, rt, e.Nodes[0].NodeID())
		}
		if st, ok := host.Get(x.ID); !ok || st.Runtime != rt {
			t.Fatalf("the node holds %s as %+v, want on %s", x.ID, st, rt)
		}
		ids[rt] = x.ID
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	release := unix.ByteSliceToString(u.Release[:])
	if r, err := admin.Exec(ctx, ids[spec.RuntimeRunc], []string{"uname", "-r"}, 30); err != nil || strings.TrimSpace(string(r.Stdout)) != release {
		t.Fatalf("runc's uname -r: %q %v, want the host's %q", r.Stdout, err, release)
	}
	if r, err := admin.Exec(ctx, ids[spec.RuntimeRunsc], []string{"dmesg"}, 30); err != nil || !strings.Contains(string(r.Stdout), "gVisor") {
		t.Fatalf("runsc's dmesg: %q %v, want gVisor's", r.Stdout, err)
	}
	if r, err := admin.Exec(ctx, ids[spec.RuntimeRunsc], []string{"uname", "-r"}, 30); err != nil || strings.TrimSpace(string(r.Stdout)) == release {
		t.Fatalf("runsc's uname -r: %q %v, the host's", r.Stdout, err)
	}
	for rt, id := range ids {
		if freed, err := admin.DeleteSandbox(ctx, id); err != nil || !freed {
			t.Fatalf("delete on %s: %v %v", rt, freed, err)
		}
		if _, ok := host.Get(id); ok {
			t.Fatalf("the node still holds %s", id)
		}
	}
}
