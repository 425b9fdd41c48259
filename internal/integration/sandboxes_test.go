package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
	"github.com/bettercompute/bettercompute/internal/sandboxes/imagetar"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// sandboxRuntime is runc when runc is installed and the tests run as root
// (BC_REQUIRE_RUNC=1 makes its absence a failure), else sim.
func sandboxRuntime(t *testing.T) string {
	t.Helper()
	_, err := exec.LookPath("runc")
	_, bbErr := imagetar.BusyboxPath()
	if err == nil && os.Geteuid() == 0 && bbErr == nil {
		return spec.RuntimeRunc
	}
	if os.Getenv("BC_REQUIRE_RUNC") == "1" {
		t.Fatalf("runc required (BC_REQUIRE_RUNC=1): runc %v, root %v, busybox %v", err, os.Geteuid() == 0, bbErr)
	}
	return spec.RuntimeSim
}

// busyboxTar is the default image, or a tiny tar when busybox is absent
// (the sim runtime never unpacks more than it must).
func busyboxTar(t *testing.T) []byte {
	t.Helper()
	if b, err := imagetar.Busybox(); err == nil {
		return b
	}
	dir := t.TempDir()
	if err := os.MkdirAll(dir+"/bin", 0o755); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := imagetar.FromDir(dir, &buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

type sandboxEnv struct {
	*testenv.Env
	rt     string
	tenant string
	admin  *client.Client
}

// startSandboxes starts an environment whose nodes are sandbox hosts and
// a tenant with the default image and a template "small" (pids 64).
func startSandboxes(t *testing.T, db *store.DB, clk clock.Clock, warm int) sandboxEnv {
	t.Helper()
	rt := sandboxRuntime(t)
	e := testenv.Start(t, db, testenv.Options{Nodes: 1, Clock: clk, SandboxRuntime: rt})
	tenant, admin := e.TenantAdmin(t, "acme")
	importSmallTemplate(t, e, admin, rt, warm)
	return sandboxEnv{Env: e, rt: rt, tenant: tenant, admin: admin}
}

// importSmallTemplate imports the default image into admin's tenant and
// makes the template "small" (pids 64) on runtime rt.
func importSmallTemplate(t *testing.T, e *testenv.Env, admin *client.Client, rt string, warm int) {
	t.Helper()
	ctx := context.Background()
	me, err := admin.Whoami(ctx)
	if err != nil {
		t.Fatalf("whoami: %v", err)
	}
	tenant := me.TenantID
	// The API's chunked upload is tested on its own; here the image goes
	// in through the module to keep the suite fast.
	if _, err := e.CP.Sandboxes.ImportBytes(ctx, audit.Entry{TenantID: tenant, Actor: "test"}, tenant, "busybox", busyboxTar(t)); err != nil {
		t.Fatalf("import: %v", err)
	}
	if err := admin.Call(ctx, "templates.create", map[string]any{"name": "small", "image": "busybox", "runtime": rt,
		"limits": map[string]any{"cpu_millis": 500, "memory_mb": 128, "pids": 64, "disk_mb": 32}, "lifetime_seconds": 600,
		"max_lifetime_seconds": 1200, "env": map[string]string{"GREETING": "hi"}, "warm": warm}, nil); err != nil {
		t.Fatalf("template: %v", err)
	}
}

// TestSandboxLifecycle creates a sandbox, runs commands in it (signed,
// attested), extends it within the template's maximum and deletes it,
// which frees it on the host.
func TestSandboxLifecycle(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		s := startSandboxes(t, db, nil, 0)
		ctx := context.Background()
		x, err := s.admin.CreateSandbox(ctx, "", "small")
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		if x.State != sandboxes.StateRunning || x.NodeID != s.Nodes[0].NodeID() || x.Runtime != s.rt {
			t.Fatalf("created %+v", x)
		}
		if _, ok := s.Nodes[0].Sandbox.Get(x.ID); !ok {
			t.Fatal("the host does not hold the sandbox")
		}
		r, err := s.admin.Exec(ctx, x.ID, []string{"echo", "hello"}, 10)
		if err != nil {
			t.Fatalf("exec: %v", err)
		}
		if string(r.Stdout) != "hello\n" || r.ExitCode != 0 || !r.Attested {
			t.Fatalf("exec answered %+v", r)
		}
		if r, err := s.admin.Exec(ctx, x.ID, []string{"false"}, 10); err != nil || r.ExitCode != 1 {
			t.Fatalf("false: %+v %v", r, err)
		}
		if r, err := s.admin.Exec(ctx, x.ID, []string{"env"}, 10); err != nil || !bytes.Contains(r.Stdout, []byte("GREETING=hi")) {
			t.Fatalf("env: %q %v", r.Stdout, err)
		}
		var list struct{ Sandboxes []client.Sandbox }
		if err := s.admin.Call(ctx, "sandboxes.list", map[string]any{}, &list); err != nil || len(list.Sandboxes) != 1 {
			t.Fatalf("list: %+v %v", list, err)
		}
		if err := s.admin.Call(ctx, "sandboxes.extend", map[string]any{"id": x.ID, "seconds": 1300}, nil); !errors.Is(err, client.ErrInvalidInput) {
			t.Fatalf("extend past the maximum: %v, want INVALID_INPUT", err)
		}
		var ext client.Sandbox
		if err := s.admin.Call(ctx, "sandboxes.extend", map[string]any{"id": x.ID, "seconds": 900}, &ext); err != nil || !ext.ExpiresAt.After(x.ExpiresAt) {
			t.Fatalf("extend: %+v %v", ext, err)
		}
		if st, _ := s.Nodes[0].Sandbox.Get(x.ID); st.DeadlineMS != ext.ExpiresAt.UnixMilli() {
			t.Fatalf("host deadline %d, want the signed %d", st.DeadlineMS, ext.ExpiresAt.UnixMilli())
		}
		freed, err := s.admin.DeleteSandbox(ctx, x.ID)
		if err != nil || !freed {
			t.Fatalf("delete: freed %v, %v", freed, err)
		}
		if _, ok := s.Nodes[0].Sandbox.Get(x.ID); ok {
			t.Fatal("the host still holds the deleted sandbox")
		}
		if _, err := s.admin.Exec(ctx, x.ID, []string{"true"}, 10); !errors.Is(err, client.ErrInvalidState) {
			t.Fatalf("exec after delete: %v, want INVALID_STATE", err)
		}
	})
}

// TestSandboxTenantIsolation: tenant B asking to get, exec in, extend or
// delete tenant A's sandbox gets exactly the answer it gets for a sandbox
// that does not exist (ACCESS_DENIED), and A's sandbox is untouched.
func TestSandboxTenantIsolation(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		s := startSandboxes(t, db, nil, 0)
		ctx := context.Background()
		x, err := s.admin.CreateSandbox(ctx, "", "small")
		if err != nil {
			t.Fatal(err)
		}
		_, b := s.TenantAdmin(t, "other")
		missing := "sbxaaaaaaaaaaaaaaaa"
		calls := map[string]func(id string) error{
			"get":  func(id string) error { _, err := b.Sandbox(ctx, id); return err },
			"exec": func(id string) error { _, err := b.Exec(ctx, id, []string{"echo", "pwned"}, 5); return err },
			"extend": func(id string) error {
				return b.Call(ctx, "sandboxes.extend", map[string]any{"id": id, "seconds": 300}, nil)
			},
			"delete": func(id string) error { _, err := b.DeleteSandbox(ctx, id); return err },
		}
		for name, call := range calls {
			theirs, none := call(x.ID), call(missing)
			var e1, e2 *client.Error
			if !errors.As(theirs, &e1) || !errors.As(none, &e2) {
				t.Fatalf("%s: %v / %v", name, theirs, none)
			}
			// The denial names the id the caller gave, as given.
			if e1.Code != "ACCESS_DENIED" || e1.Code != e2.Code || strings.ReplaceAll(e1.Message, x.ID, "ID") != strings.ReplaceAll(e2.Message, missing, "ID") || e1.Status != e2.Status {
				t.Fatalf("%s: another tenant's sandbox answers %+v, a missing one %+v", name, e1, e2)
			}
		}
		var list struct{ Sandboxes []client.Sandbox }
		if err := b.Call(ctx, "sandboxes.list", map[string]any{}, &list); err != nil || len(list.Sandboxes) != 0 {
			t.Fatalf("B lists %+v %v", list, err)
		}
		if err := b.Call(ctx, "sandboxes.list", map[string]any{"tenant_id": s.tenant}, nil); !errors.Is(err, client.ErrAccessDenied) {
			t.Fatalf("B lists A's: %v", err)
		}
		if got, err := s.admin.Sandbox(ctx, x.ID); err != nil || got.State != sandboxes.StateRunning {
			t.Fatalf("A's sandbox after B's attempts: %+v %v", got, err)
		}
		if r, err := s.admin.Exec(ctx, x.ID, []string{"echo", "ok"}, 5); err != nil || string(r.Stdout) != "ok\n" {
			t.Fatalf("A's exec: %+v %v", r, err)
		}
	})
}

// TestSandboxExpiryEnforcedByDisconnectedHost: a host that lost its
// session still stops and removes a sandbox at the deadline it was given;
// the control plane marks it expired; exec is refused within a minute of
// expiry.
func TestSandboxExpiryEnforcedByDisconnectedHost(t *testing.T) {
	clk := clock.NewFake(time.Now())
	s := startSandboxes(t, storetest.NewTestSQLite(t), clk, 0)
	ctx := context.Background()
	x, err := s.admin.CreateSandbox(ctx, "", "small")
	if err != nil {
		t.Fatal(err)
	}
	clk.Set(x.ExpiresAt.Add(-30 * time.Second))
	if _, err := s.admin.Exec(ctx, x.ID, []string{"true"}, 5); !errors.Is(err, client.ErrInvalidState) {
		t.Fatalf("exec 30 s before expiry: %v, want INVALID_STATE", err)
	}
	n := s.Nodes[0]
	n.Stop() // the host is offline from here on
	clk.Set(x.ExpiresAt.Add(time.Second))
	if removed := n.Sandbox.Sweep(ctx); removed != 1 {
		t.Fatalf("the disconnected host removed %d sandboxes, want 1", removed)
	}
	if _, ok := n.Sandbox.Get(x.ID); ok {
		t.Fatal("the host still holds the expired sandbox")
	}
	// Setting the fake clock past the deadline also fires the workers'
	// own sweep, which may mark it first: either sweep counts.
	if _, err := s.CP.Sandboxes.SweepExpired(ctx); err != nil {
		t.Fatalf("control plane sweep: %v", err)
	}
	if got, err := s.admin.Sandbox(ctx, x.ID); err != nil || got.State != sandboxes.StateExpired {
		t.Fatalf("after expiry: %+v %v", got, err)
	}
}

// TestSandboxWarmClaim: a template with a warm pool keeps started,
// unclaimed sandboxes that hold no tenant environment; a create claims
// one (getting the environment then) and the pool refills.
func TestSandboxWarmClaim(t *testing.T) {
	s := startSandboxes(t, storetest.NewTestSQLite(t), nil, 2)
	ctx := context.Background()
	tpl, err := s.CP.Sandboxes.Template(ctx, iam.ScopeOf(s.tenant), "small")
	if err != nil {
		t.Fatal(err)
	}
	waitWarm(t, s, tpl.ID, 2)
	host := s.Nodes[0].Sandbox
	warmIDs := map[string]bool{}
	for _, id := range host.Sandboxes() {
		st, _ := host.Get(id)
		if !st.Warm || len(st.Env) != 0 {
			t.Fatalf("a warm sandbox holds state %+v", st)
		}
		warmIDs[id] = true
	}
	for id := range warmIDs {
		if _, err := s.admin.Sandbox(ctx, id); !errors.Is(err, client.ErrAccessDenied) {
			t.Fatalf("a warm sandbox is visible to the tenant: %v", err)
		}
	}
	var list struct{ Sandboxes []client.Sandbox }
	if err := s.admin.Call(ctx, "sandboxes.list", map[string]any{}, &list); err != nil || len(list.Sandboxes) != 0 {
		t.Fatalf("the tenant lists warm sandboxes: %+v %v", list, err)
	}
	x, err := s.admin.CreateSandbox(ctx, "", "small")
	if err != nil {
		t.Fatal(err)
	}
	if !x.FromWarm || !warmIDs[x.ID] {
		t.Fatalf("create did not claim a warm sandbox: %+v", x)
	}
	// The claim answered before its update reached the host; an exec
	// waits for the host's answer to it first.
	if r, err := s.admin.Exec(ctx, x.ID, []string{"env"}, 10); err != nil || !bytes.Contains(r.Stdout, []byte("GREETING=hi")) {
		t.Fatalf("env after claim: %q %v", r.Stdout, err)
	}
	st, _ := host.Get(x.ID)
	// The host keeps the env as signed: the plain value sealed.
	if st.Warm || !strings.HasPrefix(st.Env["GREETING"], spec.SealedEnvPrefix) || st.DeadlineMS != x.ExpiresAt.UnixMilli() {
		t.Fatalf("claimed state %+v", st)
	}
	waitWarm(t, s, tpl.ID, 2)
}

// TestSandboxWarmClaimRefusedBack: a warm claim answers before its host
// has applied the signed update; when the host refuses that update (here:
// the sandbox vanished from the host behind the control plane's back) the
// claim is refused back: the sandbox fails with reason claim-refused, an
// exec answers INVALID_STATE, and the refusal is an audit row. The
// background settling (ConfirmClaims) does the same for a claim nobody
// touches.
func TestSandboxWarmClaimRefusedBack(t *testing.T) {
	s := startSandboxes(t, storetest.NewTestSQLite(t), nil, 2)
	ctx := context.Background()
	sb := s.CP.Sandboxes
	sb.HoldWarmRefill(true)
	tpl, err := sb.Template(ctx, iam.ScopeOf(s.tenant), "small")
	if err != nil {
		t.Fatal(err)
	}
	waitWarm(t, s, tpl.ID, 2)
	host := s.Nodes[0].Sandbox
	for _, id := range host.Sandboxes() {
		raw, _ := json.Marshal(spec.Delete{SandboxID: id})
		if _, err := host.Delete(ctx, raw); err != nil {
			t.Fatal(err)
		}
	}
	x, err := s.admin.CreateSandbox(ctx, "", "small")
	if err != nil || !x.FromWarm || x.State != sandboxes.StateRunning {
		t.Fatalf("claim: %+v %v", x, err)
	}
	_, err = s.admin.Exec(ctx, x.ID, []string{"true"}, 10)
	if !errors.Is(err, client.ErrInvalidState) {
		t.Fatalf("exec in a sandbox whose claim the host refused: %v, want INVALID_STATE", err)
	}
	got, err := sb.Get(ctx, iam.RootScope(), x.ID)
	if err != nil || got.State != sandboxes.StateFailed || got.Reason != sandboxes.ReasonClaimRefused+": sandbox-not-found" {
		t.Fatalf("after the refusal: %+v %v", got, err)
	}
	var refusedRows int
	if err := s.CP.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit_events WHERE action = 'compute:sandboxes:create' AND resource = $1 AND outcome = 'refused'`,
		"sandbox/"+x.ID).Scan(&refusedRows); err != nil || refusedRows != 1 {
		t.Fatalf("%d refused audit rows for the claim (%v), want 1", refusedRows, err)
	}

	// The second claim is settled by the background pass alone.
	y, err := s.admin.CreateSandbox(ctx, "", "small")
	if err != nil || !y.FromWarm {
		t.Fatalf("second claim: %+v %v", y, err)
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(testenv.WaitTimeout)
	for refused := 0; refused == 0; {
		if refused, err = sb.ConfirmClaims(ctx); err != nil {
			t.Fatal(err)
		}
		if refused > 0 {
			break
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatal("the refused claim was never settled")
		}
	}
	if got, _ := sb.Get(ctx, iam.RootScope(), y.ID); got.State != sandboxes.StateFailed || !strings.HasPrefix(got.Reason, sandboxes.ReasonClaimRefused) {
		t.Fatalf("after the background settling: %+v", got)
	}
	// A claim deleted before its (refused) update was answered is settled
	// too, and stays deleted (no refusal, nothing left pending).
	sb.HoldWarmRefill(false)
	waitWarm(t, s, tpl.ID, 1)
	sb.HoldWarmRefill(true)
	for _, id := range host.Sandboxes() {
		raw, _ := json.Marshal(spec.Delete{SandboxID: id})
		if _, err := host.Delete(ctx, raw); err != nil {
			t.Fatal(err)
		}
	}
	z, err := s.admin.CreateSandbox(ctx, "", "small")
	if err != nil || !z.FromWarm {
		t.Fatalf("third claim: %+v %v", z, err)
	}
	if _, err := s.admin.DeleteSandbox(ctx, z.ID); err != nil {
		t.Fatal(err)
	}
	for pending := 1; pending > 0; {
		if _, err := sb.ConfirmClaims(ctx); err != nil {
			t.Fatal(err)
		}
		if err := s.CP.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM sandboxes WHERE claim_command <> ''`).Scan(&pending); err != nil {
			t.Fatal(err)
		}
		if pending == 0 {
			break
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatal("a deleted claim stayed pending")
		}
	}
	var state string
	if err := s.CP.DB.QueryRowContext(ctx, `SELECT state FROM sandboxes WHERE id = $1`, z.ID).Scan(&state); err != nil || state != sandboxes.StateDeleted {
		t.Fatalf("the deleted claim is %q (%v), want deleted", state, err)
	}
}

// waitWarm runs the warm reconciler until the template holds n warm
// sandboxes (the background worker may start some as well).
func waitWarm(t *testing.T, s sandboxEnv, tpl string, n int) {
	t.Helper()
	ctx := context.Background()
	// The workers' own refill may have starts in flight (counted as
	// starting, not yet warm): reconcile and re-check until the deadline.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(testenv.WaitTimeout)
	for {
		if _, err := s.CP.Sandboxes.ReconcileWarm(ctx); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.CP.Sandboxes.WarmCount(ctx, tpl); got >= n {
			return
		}
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("the warm pool never reached %d", n)
		}
	}
}

// TestSandboxRuncLimitsAndNetwork runs, through the control plane, what
// the runc driver promises: the image's root, not the host's; no TCP
// connection to a listener on the host's loopback under network none; a
// fork bomb stopped at the pids limit (64) with the host responsive.
func TestSandboxRuncLimitsAndNetwork(t *testing.T) {
	s := startSandboxes(t, storetest.NewTestSQLite(t), nil, 0)
	if s.rt != spec.RuntimeRunc {
		t.Skip("runc is not available (set BC_REQUIRE_RUNC=1 to require it)")
	}
	ctx := context.Background()
	x, err := s.admin.CreateSandbox(ctx, "", "small")
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.admin.Exec(ctx, x.ID, []string{"ls", "/"}, 10)
	if err != nil {
		t.Fatal(err)
	}
	root := strings.Fields(string(r.Stdout))
	if !contains(root, "bin") || contains(root, "work") || contains(root, "var") || contains(root, "boot") {
		t.Fatalf("ls / = %v", root)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int32
	acceptDone := make(chan struct{})
	go func() {
		defer close(acceptDone)
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	port := strconv.Itoa(lis.Addr().(*net.TCPAddr).Port)
	if r, err := s.admin.Exec(ctx, x.ID, []string{"nc", "-w", "2", "127.0.0.1", port}, 10); err != nil || r.ExitCode == 0 {
		t.Fatalf("nc to the host's loopback: %+v %v", r, err)
	}
	lis.Close()
	<-acceptDone
	if accepted.Load() != 0 {
		t.Fatalf("the host's listener accepted %d connections from the sandbox", accepted.Load())
	}
	r, err = s.admin.Exec(ctx, x.ID, []string{"sh", "-c", "(b(){ b|b& }; b) & exec sleep 60"}, 3)
	if err != nil {
		t.Fatal(err)
	}
	if !r.TimedOut || !bytes.Contains(r.Stderr, []byte("can't fork")) {
		t.Fatalf("fork bomb: timed out %v, stderr %q", r.TimedOut, r.Stderr[:min(len(r.Stderr), 200)])
	}
	if out, err := exec.Command("true").CombinedOutput(); err != nil {
		t.Fatalf("the host cannot run a process: %v %s", err, out)
	}
	if r, err := s.admin.Exec(ctx, x.ID, []string{"echo", "alive"}, 10); err != nil || string(r.Stdout) != "alive\n" {
		t.Fatalf("after the bomb: %+v %v", r, err)
	}
	if freed, err := s.admin.DeleteSandbox(ctx, x.ID); err != nil || !freed {
		t.Fatalf("delete: %v %v", freed, err)
	}
	if _, err := os.Stat("/sys/fs/cgroup/pids/bcsandbox/" + x.ID); !os.IsNotExist(err) {
		t.Fatalf("the sandbox's cgroup survived its delete: %v", err)
	}
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// TestSandboxImageImportThroughAPI uploads an image through the upload
// endpoint: the stored digest is the SHA-256 of the bytes, a digest that
// does not match is refused, writes must continue where the server
// stands, and another tenant cannot write to the upload.
func TestSandboxImageImportThroughAPI(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{SandboxRuntime: spec.RuntimeSim})
	_, a := e.TenantAdmin(t, "acme")
	_, b := e.TenantAdmin(t, "other")
	ctx := context.Background()
	tarball := bytes.Repeat([]byte("bettercompute"), 8000)
	img, err := a.ImportImage(ctx, "", "blob", tarball)
	if err != nil {
		t.Fatal(err)
	}
	if img.Digest != imagetar.Digest(tarball) || img.SizeBytes != int64(len(tarball)) {
		t.Fatalf("imported %+v", img)
	}
	var begin struct {
		UploadID string `json:"upload_id"`
	}
	if err := a.Call(ctx, "images.beginUpload", map[string]any{}, &begin); err != nil {
		t.Fatal(err)
	}
	if err := b.Upload(ctx, begin.UploadID, bytes.NewReader([]byte("hello")), 5, nil); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("another tenant's write: %v, want NOT_FOUND", err)
	}
	if err := a.Upload(ctx, begin.UploadID, bytes.NewReader([]byte("hello")), 5, nil); err != nil {
		t.Fatal(err)
	}
	wrong := imagetar.Digest([]byte("something else"))
	if err := a.Call(ctx, "images.import", map[string]any{"upload_id": begin.UploadID, "name": "x", "digest": wrong}, nil); !errors.Is(err, client.ErrInvalidInput) {
		t.Fatalf("a wrong digest: %v, want INVALID_INPUT", err)
	}
}

// TestSandboxPlacement: sandboxes go only to connected hosts whose
// bcd-set labels advertise the template's runtime; a template cannot
// require a runtime.* label itself, and with no such host a create is
// INVALID_STATE.
func TestSandboxPlacement(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Nodes: 1, SandboxRuntime: spec.RuntimeSim})
	tenant, admin := e.TenantAdmin(t, "acme")
	ctx := context.Background()
	if _, err := e.CP.Sandboxes.ImportBytes(ctx, audit.Entry{TenantID: tenant, Actor: "test"}, tenant, "img", busyboxTar(t)); err != nil {
		t.Fatal(err)
	}
	mk := func(name, runtime string, labels map[string]string) error {
		return admin.Call(ctx, "templates.create", map[string]any{"name": name, "image": "img", "runtime": runtime, "labels": labels}, nil)
	}
	if err := mk("forged", spec.RuntimeSim, map[string]string{"runtime.runc": "true"}); !errors.Is(err, client.ErrInvalidInput) {
		t.Fatalf("a template naming a runtime. label: %v, want INVALID_INPUT", err)
	}
	for _, tc := range [][2]string{{"sim", spec.RuntimeSim}, {"runc", spec.RuntimeRunc}} {
		if err := mk(tc[0], tc[1], nil); err != nil {
			t.Fatal(err)
		}
	}
	node, err := e.CP.Nodes.Get(ctx, iam.RootScope(), e.Nodes[0].NodeID())
	if err != nil || node.Labels["runtime.sim"] != "true" || node.Labels["runtime.runc"] != "" {
		t.Fatalf("the sim host advertises %v", node.Labels)
	}
	if _, err := admin.CreateSandbox(ctx, "", "runc"); !errors.Is(err, client.ErrInvalidState) {
		t.Fatalf("runc template on a sim-only fleet: %v, want INVALID_STATE", err)
	}
	if err := admin.Call(ctx, "templates.create", map[string]any{"name": "sim-egress", "image": "img", "runtime": spec.RuntimeSim, "network": "egress"}, nil); err != nil {
		t.Fatal(err)
	}
	if node.Labels[spec.EgressLabel] != "" {
		t.Fatalf("the sim host advertises egress: %v", node.Labels)
	}
	// Refused at placement, by the control plane, not by a host that got
	// the sandbox and could not wire it.
	if _, err := admin.CreateSandbox(ctx, "", "sim-egress"); !errors.Is(err, client.ErrInvalidState) || !strings.Contains(err.Error(), "no connected host has the sim runtime") {
		t.Fatalf("egress template on a fleet without egress: %v, want INVALID_STATE from placement", err)
	}
	if err := admin.Call(ctx, "templates.create", map[string]any{"name": "host-net", "image": "img", "runtime": spec.RuntimeSim, "network": "host"}, nil); !errors.Is(err, client.ErrInvalidInput) {
		t.Fatalf("network host: %v, want INVALID_INPUT", err)
	}
	// gVisor cannot join the egress link's namespace: a runsc template
	// with egress is refused at create, naming why.
	if err := admin.Call(ctx, "templates.create", map[string]any{"name": "gvisor-egress", "image": "img", "runtime": spec.RuntimeRunsc, "network": "egress"}, nil); !errors.Is(err, client.ErrInvalidInput) || !strings.Contains(err.Error(), "egress is not available on runsc") {
		t.Fatalf("runsc with egress: %v, want INVALID_INPUT naming runsc", err)
	}
	if _, err := admin.CreateSandbox(ctx, "", "sim"); err != nil {
		t.Fatal(err)
	}
	e.Nodes[0].Stop()
	e.Nodes[0].WaitDisconnected(t)
	waitDisconnectedInRegistry(t, e, e.Nodes[0].NodeID())
	if _, err := admin.CreateSandbox(ctx, "", "sim"); !errors.Is(err, client.ErrInvalidState) {
		t.Fatalf("create with the only host offline: %v, want INVALID_STATE", err)
	}
}

// waitDisconnectedInRegistry waits (on node pokes) until the control
// plane's registry shows the node without a live session.
func waitDisconnectedInRegistry(t *testing.T, e *testenv.Env, id string) {
	t.Helper()
	poke, stop := e.CP.Bus.Subscribe(bus.NodeTopic(id))
	defer stop()
	timeout := time.After(testenv.WaitTimeout)
	for {
		n, err := e.CP.Nodes.Get(context.Background(), iam.RootScope(), id)
		if err == nil && !n.Connected {
			return
		}
		select {
		case <-poke:
		case <-time.After(50 * time.Millisecond):
		case <-timeout:
			t.Fatal("the registry still shows the node connected")
		}
	}
}

// TestSandboxRuncEgress creates a sandbox of a template with network
// egress on a runc host with egress wired: the host advertises it, the
// sandbox gets the proxy variables, cannot reach the host's loopback
// directly, and the proxy refuses a loopback target with its reason.
// Deleting the sandbox removes its link. Every target is on this machine.
func TestSandboxRuncEgress(t *testing.T) {
	if sandboxRuntime(t) != spec.RuntimeRunc {
		t.Skip("runc is not available (set BC_REQUIRE_RUNC=1 to require it)")
	}
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Nodes: 1, SandboxRuntime: spec.RuntimeRunc, SandboxEgress: true})
	tenant, admin := e.TenantAdmin(t, "acme")
	ctx := context.Background()
	if _, err := e.CP.Sandboxes.ImportBytes(ctx, audit.Entry{TenantID: tenant, Actor: "test"}, tenant, "busybox", busyboxTar(t)); err != nil {
		t.Fatal(err)
	}
	if err := admin.Call(ctx, "templates.create", map[string]any{"name": "net", "image": "busybox", "runtime": spec.RuntimeRunc, "network": "egress",
		"limits": map[string]any{"cpu_millis": 500, "memory_mb": 128, "pids": 64, "disk_mb": 32}}, nil); err != nil {
		t.Fatal(err)
	}
	x, err := admin.CreateSandbox(ctx, "", "net")
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	st, ok := e.Nodes[0].Sandbox.Get(x.ID)
	if !ok || st.Link == nil {
		t.Fatalf("host state %+v: no egress link", st)
	}
	proxyPort := strconv.Itoa(st.Link.ProxyPort)
	r, err := admin.Exec(ctx, x.ID, []string{"env"}, 10)
	if err != nil || !bytes.Contains(r.Stdout, []byte("HTTP_PROXY=http://"+st.Link.HostAddr+":"+proxyPort+"\n")) {
		t.Fatalf("env: %q %v", r.Stdout, err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	port := strconv.Itoa(lis.Addr().(*net.TCPAddr).Port)
	if r, err := admin.Exec(ctx, x.ID, []string{"nc", "-w", "2", "127.0.0.1", port}, 10); err != nil || r.ExitCode == 0 {
		t.Fatalf("nc to the host's loopback: %+v %v", r, err)
	}
	req := "GET http://127.0.0.1:" + port + "/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
	r, err = admin.Exec(ctx, x.ID, []string{"sh", "-c", `f=$(mktemp -u) && mkfifo "$f" && { nc -w 5 "$2" "$3" <"$f" & exec 3>"$f"; printf '%s' "$1" >&3; wait $!; }`,
		"sh", req, st.Link.HostAddr, proxyPort}, 15)
	if err != nil || !bytes.HasPrefix(r.Stdout, []byte("HTTP/1.1 403 ")) || !bytes.HasSuffix(r.Stdout, []byte("\r\n\r\nrefused: loopback\n")) {
		t.Fatalf("through the proxy to the host's loopback: %q %v", r.Stdout, err)
	}
	if freed, err := admin.DeleteSandbox(ctx, x.ID); err != nil || !freed {
		t.Fatalf("delete: %v %v", freed, err)
	}
	if _, err := os.Stat("/sys/class/net/" + st.Link.HostIf); !os.IsNotExist(err) {
		t.Fatalf("the link survived the delete: %v", err)
	}
}

// TestSandboxExecOutputCap has a sandbox write 9 MiB on each stream: the
// answer, after the node-signed update over gRPC, bcd's journal, the
// control plane and the API, holds exactly the first 8 MiB of each with
// truncation flagged, and a result that large fits every limit on the way.
func TestSandboxExecOutputCap(t *testing.T) {
	s := startSandboxes(t, storetest.NewTestSQLite(t), nil, 0)
	if s.rt != spec.RuntimeRunc {
		t.Skip("runc is not available (set BC_REQUIRE_RUNC=1 to require it)")
	}
	ctx := context.Background()
	x, err := s.admin.CreateSandbox(ctx, "", "small")
	if err != nil {
		t.Fatal(err)
	}
	const nine = 9 << 20
	r, err := s.admin.Exec(ctx, x.ID, []string{"sh", "-c", `head -c "$1" /dev/zero; yes | head -c "$1" >&2`, "sh", strconv.Itoa(nine)}, 60)
	if err != nil {
		t.Fatalf("exec: %v", err)
	}
	if r.ExitCode != 0 || !r.Attested || r.TimedOut {
		t.Fatalf("exec: exit %d attested %v timed out %v", r.ExitCode, r.Attested, r.TimedOut)
	}
	if len(r.Stdout) != spec.MaxOutput || !r.StdoutTruncated || !bytes.Equal(r.Stdout, make([]byte, spec.MaxOutput)) {
		t.Fatalf("stdout: %d bytes, truncated %v; want exactly %d zero bytes, truncated", len(r.Stdout), r.StdoutTruncated, spec.MaxOutput)
	}
	if len(r.Stderr) != spec.MaxOutput || !r.StderrTruncated || !bytes.Equal(r.Stderr, bytes.Repeat([]byte("y\n"), spec.MaxOutput/2)) {
		t.Fatalf("stderr: %d bytes, truncated %v; want exactly %d bytes of yes, truncated", len(r.Stderr), r.StderrTruncated, spec.MaxOutput)
	}
	if r, err := s.admin.Exec(ctx, x.ID, []string{"sh", "-c", `head -c "$1" /dev/zero`, "sh", strconv.Itoa(spec.MaxOutput)}, 30); err != nil || len(r.Stdout) != spec.MaxOutput || r.StdoutTruncated {
		t.Fatalf("exactly 8 MiB: %d bytes truncated %v, %v", len(r.Stdout), r.StdoutTruncated, err)
	}
}

// requireRunscOr skips the test, loudly, unless runsc, root and
// busybox-static are there; with BC_REQUIRE_RUNSC=1 it fails instead.
func requireRunscOr(t *testing.T) {
	t.Helper()
	_, err := exec.LookPath("runsc")
	_, bbErr := imagetar.BusyboxPath()
	if err != nil || os.Geteuid() != 0 || bbErr != nil {
		msg := "RUNSC TEST NOT RUN: needs runsc, root and busybox-static"
		if os.Getenv("BC_REQUIRE_RUNSC") == "1" {
			t.Fatalf("%s (BC_REQUIRE_RUNSC=1): runsc %v, root %v, busybox %v", msg, err, os.Geteuid() == 0, bbErr)
		}
		t.Skip(msg)
	}
}

// TestSandboxRunsc runs a template on runsc (gVisor, ptrace platform)
// through the API: echo answers, `ls /` shows the image and not the host,
// the user is not root, and delete frees it. It needs runsc and root and
// skips loudly without them (BC_REQUIRE_RUNSC=1 makes that a failure).
func TestSandboxRunsc(t *testing.T) {
	requireRunscOr(t)
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Nodes: 1, SandboxRuntime: spec.RuntimeRunsc})
	tenant, admin := e.TenantAdmin(t, "acme")
	ctx := context.Background()
	if _, err := e.CP.Sandboxes.ImportBytes(ctx, audit.Entry{TenantID: tenant, Actor: "test"}, tenant, "busybox", busyboxTar(t)); err != nil {
		t.Fatal(err)
	}
	if err := admin.Call(ctx, "templates.create", map[string]any{"name": "gvisor", "image": "busybox", "runtime": spec.RuntimeRunsc,
		"limits": map[string]any{"cpu_millis": 500, "memory_mb": 128, "pids": 64, "disk_mb": 32}}, nil); err != nil {
		t.Fatal(err)
	}
	x, err := admin.CreateSandbox(ctx, "", "gvisor")
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if x.Runtime != spec.RuntimeRunsc {
		t.Fatalf("runtime %s", x.Runtime)
	}
	if r, err := admin.Exec(ctx, x.ID, []string{"echo", "hello"}, 30); err != nil || string(r.Stdout) != "hello\n" || !r.Attested {
		t.Fatalf("echo: %+v %v", r, err)
	}
	r, err := admin.Exec(ctx, x.ID, []string{"ls", "/"}, 30)
	if err != nil {
		t.Fatal(err)
	}
	root := strings.Fields(string(r.Stdout))
	if !contains(root, "bin") || contains(root, "work") || contains(root, "var") || contains(root, "boot") {
		t.Fatalf("ls / = %v", root)
	}
	if r, err := admin.Exec(ctx, x.ID, []string{"id", "-u"}, 30); err != nil || strings.TrimSpace(string(r.Stdout)) != "65534" {
		t.Fatalf("id -u: %q %v", r.Stdout, err)
	}
	if freed, err := admin.DeleteSandbox(ctx, x.ID); err != nil || !freed {
		t.Fatalf("delete: %v %v", freed, err)
	}
}
