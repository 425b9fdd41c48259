package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"gocloud.dev/blob"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/sandboxes/imagetar"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// RequireRunc skips the test unless runc is installed and the test runs
// as root; with BC_REQUIRE_RUNC=1 (CI) it fails instead.
func RequireRunc(t testing.TB) string { return requireRuntime(t, "runc", "BC_REQUIRE_RUNC") }

// requireRuntime skips the test, loudly, unless the OCI runtime name is
// installed, the test runs as root and a static busybox is there to build
// the image; when the environment variable env is 1 it fails instead.
func requireRuntime(t testing.TB, name, env string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	why := ""
	switch {
	case err != nil:
		why = name + " is not installed"
	case os.Geteuid() != 0:
		why = name + " sandboxes need root"
	}
	if why == "" {
		if _, err := imagetar.BusyboxPath(); err != nil {
			why = err.Error()
		}
	}
	if why != "" {
		if os.Getenv(env) == "1" {
			t.Fatalf("%s required (%s=1): %s", name, env, why)
		}
		t.Skipf("%s TEST NOT RUN: %s (set %s=1 to make this fatal)", strings.ToUpper(name), why, env)
	}
	return p
}

// testHost opens a host on rt with an in-memory image store holding the
// busybox image, and returns it with the image's digest.
func testHost(t *testing.T, rt func(dir string) Runtime, clk clock.Clock) (*Host, string) {
	t.Helper()
	return testHostEgress(t, rt, clk, nil)
}

// testHostEgress is testHost with egress wiring (nil: none).
func testHostEgress(t *testing.T, rt func(dir string) Runtime, clk clock.Clock, eg *Egress) (*Host, string) {
	t.Helper()
	return testHostRuntimes(t, func(dir string) []Runtime { return []Runtime{rt(filepath.Join(dir, "rt"))} }, clk, eg)
}

// testHostRuntimes is testHostEgress on the runtimes rts makes in the
// host's directory.
func testHostRuntimes(t *testing.T, rts func(dir string) []Runtime, clk clock.Clock, eg *Egress) (*Host, string) {
	t.Helper()
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "bcsbx-") // short: overlay options hold paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	url := "mem://"
	im, err := OpenImages(ctx, url, filepath.Join(dir, "images"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { im.Close() })
	tarball, err := imagetar.Busybox()
	if err != nil {
		t.Skip(err)
	}
	digest := imagetar.Digest(tarball)
	if err := im.bucket.WriteAll(ctx, ImageKey(digest), tarball, nil); err != nil {
		t.Fatal(err)
	}
	all := rts(dir)
	cfg := HostConfig{Dir: dir, Runtimes: all[1:], Images: im, Clock: clk, Log: slog.New(slog.NewTextHandler(testLogOut(io.Discard), nil)), Slots: 8, MemoryMB: 4096, Egress: eg}
	// One runtime stays the shorthand, as the tests reach it there.
	cfg.Runtime = all[0]
	h, err := OpenHost(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, id := range h.Sandboxes() {
			_ = h.remove(context.Background(), id)
		}
	})
	return h, digest
}

var _ = blob.OpenBucket

func runcRuntime(t *testing.T) func(string) Runtime {
	bin := RequireRunc(t)
	return func(dir string) Runtime {
		o, err := NewOCI(spec.RuntimeRunc, bin, dir)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
}

func createSpec(digest string, deadline time.Time, pids int64) spec.Create {
	return spec.Create{SandboxID: ids.New("sbx"), ImageDigest: digest, Runtime: spec.RuntimeRunc,
		Limits: spec.Limits{CPUMillis: 500, MemoryMB: 128, Pids: pids, DiskMB: 64}, Network: spec.NetworkNone,
		DeadlineMS: deadline.UnixMilli()}
}

func mustCreate(t *testing.T, h *Host, c spec.Create) {
	t.Helper()
	raw, _ := json.Marshal(c)
	if _, err := h.Create(context.Background(), raw); err != nil {
		t.Fatalf("create: %v", err)
	}
}

func execIn(t *testing.T, h *Host, id string, timeout time.Duration, argv ...string) spec.ExecResult {
	t.Helper()
	raw, _ := json.Marshal(spec.Exec{SandboxID: id, Argv: argv, TimeoutMS: timeout.Milliseconds()})
	out, err := h.Exec(context.Background(), raw)
	if err != nil {
		t.Fatalf("exec %v: %v", argv, err)
	}
	var r spec.ExecResult
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestRuncSandboxIsolation runs a real runc sandbox and checks, from
// inside, what the spec promises: the image's root (not the host's), its
// own hostname, uid 65534, no capabilities, no new privileges, the seccomp
// filter, masked /proc/kcore, and a network namespace with nothing but
// loopback.
func TestRuncSandboxIsolation(t *testing.T) {
	h, digest := testHost(t, runcRuntime(t), clock.Real{})
	c := createSpec(digest, time.Now().Add(10*time.Minute), 64)
	mustCreate(t, h, c)
	if r := execIn(t, h, c.SandboxID, 10*time.Second, "echo", "hello"); string(r.Stdout) != "hello\n" || r.ExitCode != 0 {
		t.Fatalf("echo: %+v", r)
	}
	r := execIn(t, h, c.SandboxID, 10*time.Second, "ls", "/")
	root := strings.Fields(string(r.Stdout))
	for _, want := range []string{"bin", "etc", "tmp"} {
		if !contains(root, want) {
			t.Fatalf("ls / = %q, missing the image's %s", root, want)
		}
	}
	for _, host := range []string{"work", "usr/local", "boot", "var"} {
		if contains(root, host) {
			t.Fatalf("ls / = %q shows the host's %s", root, host)
		}
	}
	if r := execIn(t, h, c.SandboxID, 10*time.Second, "hostname"); strings.TrimSpace(string(r.Stdout)) != c.SandboxID {
		t.Fatalf("hostname = %q, want %s", r.Stdout, c.SandboxID)
	}
	if r := execIn(t, h, c.SandboxID, 10*time.Second, "id", "-u"); strings.TrimSpace(string(r.Stdout)) != "65534" {
		t.Fatalf("id -u = %q, want 65534", r.Stdout)
	}
	status := string(execIn(t, h, c.SandboxID, 10*time.Second, "cat", "/proc/self/status").Stdout)
	for _, want := range []string{"CapInh:\t0000000000000000", "CapPrm:\t0000000000000000", "CapEff:\t0000000000000000",
		"CapBnd:\t0000000000000000", "CapAmb:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2"} {
		if !strings.Contains(status, want) {
			t.Fatalf("/proc/self/status lacks %q:\n%s", want, status)
		}
	}
	masked := 0
	for _, p := range maskedPaths {
		if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() {
			continue
		}
		masked++
		if r := execIn(t, h, c.SandboxID, 10*time.Second, "cat", p); len(r.Stdout) != 0 {
			t.Fatalf("%s is not masked: %d bytes", p, len(r.Stdout))
		}
	}
	if masked == 0 {
		t.Fatal("no masked path exists on this host to check")
	}
	if r := execIn(t, h, c.SandboxID, 10*time.Second, "touch", "/proc/sys/kernel/bc-test"); r.ExitCode == 0 {
		t.Fatal("/proc/sys is writable")
	}
	ifs := execIn(t, h, c.SandboxID, 10*time.Second, "cat", "/proc/net/dev").Stdout
	for _, line := range strings.Split(string(ifs), "\n")[2:] {
		if name, _, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && name != "lo" {
			t.Fatalf("the sandbox sees interface %q:\n%s", name, ifs)
		}
	}
	// Root-only and namespace-making calls fail inside.
	if r := execIn(t, h, c.SandboxID, 10*time.Second, "unshare", "-U", "true"); r.ExitCode == 0 {
		t.Fatalf("unshare -U succeeded inside the sandbox: %+v", r)
	}
}

// TestRuncNetworkNoneCannotReachHostLoopback listens on the host's
// 127.0.0.1 and has the sandbox try to connect: under network none the
// connection fails and the listener sees nothing.
func TestRuncNetworkNoneCannotReachHostLoopback(t *testing.T) {
	h, digest := testHost(t, runcRuntime(t), clock.Real{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	var accepted atomic.Int32
	go func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			conn.Close()
		}
	}()
	port := lis.Addr().(*net.TCPAddr).Port
	c := createSpec(digest, time.Now().Add(10*time.Minute), 64)
	mustCreate(t, h, c)
	r := execIn(t, h, c.SandboxID, 20*time.Second, "wget", "-q", "-T", "3", "-O", "-", "http://127.0.0.1:"+itoa(port)+"/")
	if r.ExitCode == 0 {
		t.Fatalf("wget to the host's loopback succeeded: %+v", r)
	}
	r = execIn(t, h, c.SandboxID, 20*time.Second, "nc", "-w", "2", "127.0.0.1", itoa(port))
	if r.ExitCode == 0 {
		t.Fatalf("nc to the host's loopback succeeded: %+v", r)
	}
	// Close the listener and wait for its goroutine's Accept to return, so
	// the count is final.
	lis.Close()
	if n := accepted.Load(); n != 0 {
		t.Fatalf("the host listener accepted %d connections from the sandbox", n)
	}
}

// TestRuncForkBombStopsAtPidsLimit runs a fork bomb under a pids limit of
// 64 with a 3 s timeout: forks fail at the limit, everything the exec
// started is killed at the timeout, the host keeps running processes, and
// the sandbox is usable again afterwards (its init reaped the bomb).
func TestRuncForkBombStopsAtPidsLimit(t *testing.T) {
	h, digest := testHost(t, runcRuntime(t), clock.Real{})
	c := createSpec(digest, time.Now().Add(10*time.Minute), 64)
	mustCreate(t, h, c)
	done := make(chan spec.ExecResult, 1)
	go func() {
		raw, _ := json.Marshal(spec.Exec{SandboxID: c.SandboxID, Argv: []string{"sh", "-c", "(b(){ b|b& }; b) & exec sleep 60"}, TimeoutMS: 3000})
		out, err := h.Exec(context.Background(), raw)
		var r spec.ExecResult
		if err == nil {
			_ = json.Unmarshal(out, &r)
		}
		done <- r
	}()
	// While the bomb runs, the host still runs its own processes.
	if out, err := exec.Command("true").CombinedOutput(); err != nil {
		t.Fatalf("the host could not run a process during the fork bomb: %v %s", err, out)
	}
	r := <-done
	if !r.TimedOut || r.ExitCode != 137 {
		t.Fatalf("fork bomb was not killed at the timeout: exit %d timed out %v", r.ExitCode, r.TimedOut)
	}
	if !bytes.Contains(r.Stderr, []byte("can't fork")) {
		t.Fatalf("the bomb never hit the pids limit: %q", r.Stderr)
	}
	max := readInt(t, "/sys/fs/cgroup/pids"+CgroupParent+"/"+c.SandboxID+"/pids.max")
	if max != 64 {
		t.Fatalf("pids.max = %d, want 64", max)
	}
	if peak := readIntOr("/sys/fs/cgroup/pids"+CgroupParent+"/"+c.SandboxID+"/pids.peak", -1); peak > 64 {
		t.Fatalf("pids.peak = %d over the limit", peak)
	}
	// The sandbox is usable again: the init reaped the killed bomb.
	if r := execIn(t, h, c.SandboxID, 10*time.Second, "echo", "alive"); string(r.Stdout) != "alive\n" {
		t.Fatalf("after the fork bomb: %+v", r)
	}
}

// TestRuncDeleteFreesResources deletes a sandbox and checks that the
// runtime instance, cgroup, mounts, bundle and state are gone.
func TestRuncDeleteFreesResources(t *testing.T) {
	h, digest := testHost(t, runcRuntime(t), clock.Real{})
	c := createSpec(digest, time.Now().Add(10*time.Minute), 64)
	mustCreate(t, h, c)
	raw, _ := json.Marshal(spec.Delete{SandboxID: c.SandboxID})
	if _, err := h.Delete(context.Background(), raw); err != nil {
		t.Fatal(err)
	}
	assertGone(t, h, c.SandboxID)
}

// TestRuncHostSweepRemovesExpired gives a sandbox a deadline, moves the
// clock past it and sweeps, as the host does with no session: the
// sandbox is stopped and removed, and exec is refused before that once
// the deadline passed.
func TestRuncHostSweepRemovesExpired(t *testing.T) {
	clk := clock.NewFake(time.Now())
	h, digest := testHost(t, runcRuntime(t), clk)
	c := createSpec(digest, clk.Now().Add(2*time.Minute), 64)
	mustCreate(t, h, c)
	clk.Advance(3 * time.Minute)
	raw, _ := json.Marshal(spec.Exec{SandboxID: c.SandboxID, Argv: []string{"true"}, TimeoutMS: 1000})
	if _, err := h.Exec(context.Background(), raw); err == nil || err.Error() != "sandbox-expired" {
		t.Fatalf("exec after the deadline: %v, want sandbox-expired", err)
	}
	if n := h.Sweep(context.Background()); n != 1 {
		t.Fatalf("swept %d, want 1", n)
	}
	assertGone(t, h, c.SandboxID)
}

func assertGone(t *testing.T, h *Host, id string) {
	t.Helper()
	if _, ok := h.Get(id); ok {
		t.Fatal("state still held")
	}
	if _, err := os.Stat(h.statePath(id)); !os.IsNotExist(err) {
		t.Fatalf("state file: %v", err)
	}
	for _, n := range h.names {
		assertGoneFrom(t, h.rts[n], id)
	}
}

// assertGoneFrom checks that runtime rt holds nothing of sandbox id.
func assertGoneFrom(t *testing.T, rt Runtime, id string) {
	t.Helper()
	if rt.Running(context.Background(), id) {
		t.Fatalf("runtime %s still has the sandbox", rt.Name())
	}
	if o, ok := rt.(*OCI); ok {
		if _, err := os.Stat(o.bundle(id)); !os.IsNotExist(err) {
			t.Fatalf("bundle still there: %v", err)
		}
		if _, err := os.Stat("/sys/fs/cgroup/pids" + CgroupParent + "/" + id); !os.IsNotExist(err) {
			t.Fatalf("cgroup still there: %v", err)
		}
		mounts, _ := os.ReadFile("/proc/self/mountinfo")
		if bytes.Contains(mounts, []byte(id)) {
			t.Fatal("a mount of the sandbox is left")
		}
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

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func readInt(t *testing.T, p string) int {
	t.Helper()
	n := readIntOr(p, -2)
	if n == -2 {
		t.Fatalf("read %s", p)
	}
	return n
}

func readIntOr(p string, def int) int {
	b, err := os.ReadFile(p)
	if err != nil {
		return def
	}
	var n int
	if err := json.Unmarshal(bytes.TrimSpace(b), &n); err != nil {
		return def
	}
	return n
}

// testLogOut is where test hosts log: w, or stderr with BC_TEST_LOG=1.
func testLogOut(w io.Writer) io.Writer {
	if os.Getenv("BC_TEST_LOG") == "1" {
		return os.Stderr
	}
	return w
}
