package sandbox

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// RequireRunsc skips the test, loudly, unless gVisor's runsc is installed
// and the test runs as root; with BC_REQUIRE_RUNSC=1 it fails instead.
func RequireRunsc(t testing.TB) string { return requireRuntime(t, "runsc", "BC_REQUIRE_RUNSC") }

func runscRuntime(t *testing.T) func(string) Runtime {
	bin := RequireRunsc(t)
	return func(dir string) Runtime {
		o, err := NewOCI(spec.RuntimeRunsc, bin, dir)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
}

// TestRunscSandbox runs a real gVisor sandbox: echo answers, `ls /`
// shows the image and not the host, the user is 65534, and delete
// frees it.
func TestRunscSandbox(t *testing.T) {
	h, digest := testHost(t, runscRuntime(t), clock.Real{})
	c := createSpec(digest, time.Now().Add(10*time.Minute), 64)
	c.Runtime = spec.RuntimeRunsc
	mustCreate(t, h, c)
	if r := execIn(t, h, c.SandboxID, 30*time.Second, "echo", "hello"); string(r.Stdout) != "hello\n" || r.ExitCode != 0 {
		t.Fatalf("echo: %+v", r)
	}
	root := strings.Fields(string(execIn(t, h, c.SandboxID, 30*time.Second, "ls", "/").Stdout))
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
	if r := execIn(t, h, c.SandboxID, 30*time.Second, "id", "-u"); strings.TrimSpace(string(r.Stdout)) != "65534" {
		t.Fatalf("id -u = %q, want 65534", r.Stdout)
	}
	// runsc puts its own processes under the sandbox's cgroup with the
	// signed limits.
	if max := readIntOr("/sys/fs/cgroup/pids"+CgroupParent+"/"+c.SandboxID+"/pids.max", -1); max != 64 {
		t.Fatalf("pids.max = %d, want 64", max)
	}
	if mem := readIntOr("/sys/fs/cgroup/memory"+CgroupParent+"/"+c.SandboxID+"/memory.limit_in_bytes", -1); mem != 128<<20 {
		t.Fatalf("memory.limit_in_bytes = %d, want %d", mem, 128<<20)
	}
	// An exec past its timeout is killed inside the sandbox, which keeps
	// working.
	if r := execIn(t, h, c.SandboxID, 2*time.Second, "sleep", "60"); !r.TimedOut || r.ExitCode != 137 {
		t.Fatalf("sleep past the timeout: %+v", r)
	}
	if r := execIn(t, h, c.SandboxID, 30*time.Second, "echo", "alive"); string(r.Stdout) != "alive\n" {
		t.Fatalf("after the timeout: %+v", r)
	}
	raw, _ := json.Marshal(spec.Delete{SandboxID: c.SandboxID})
	if _, err := h.Delete(context.Background(), raw); err != nil {
		t.Fatal(err)
	}
	assertGone(t, h, c.SandboxID)
}

// TestOpenRunscAdvertisesOnlyWhenItWorks opens a runsc host, which probes
// gVisor first and then advertises runtime.runsc=true; a runsc binary
// that does not run a sandbox fails the probe, so it is never advertised.
func TestOpenRunscAdvertisesOnlyWhenItWorks(t *testing.T) {
	RequireRunsc(t)
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "bcsbx-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	h, closeFn, err := Open(ctx, Options{DataDir: dir, Runtime: spec.RuntimeRunsc, ImageStore: "mem://", Egress: "off"})
	if err != nil {
		t.Fatalf("open runsc: %v", err)
	}
	defer closeFn()
	if l := h.Labels(); l[spec.RuntimeLabel(spec.RuntimeRunsc)] != "true" {
		t.Fatalf("labels %v lack runtime.runsc=true", l)
	}
	if err := ProbeRunsc(ctx, "/bin/false", dir); err == nil || !strings.Contains(err.Error(), "runsc does not work here") {
		t.Fatalf("probe of a binary that runs nothing: %v", err)
	}
}

// TestRunscTmpBoundedAndDeathReported: in a gVisor sandbox /tmp counts
// against the disk limit (a 40 MiB write under a 16 MiB limit stops at
// the limit); and when the gVisor kernel is killed (here by SIGKILL from
// the host, as the kernel's OOM killer or the pids limit would), the
// host's sweep finds the runtime dead within seconds, removes the
// sandbox, and an exec answers sandbox-failed.
func TestRunscTmpBoundedAndDeathReported(t *testing.T) {
	var rt *OCI
	newRT := runscRuntime(t)
	h, digest := testHost(t, func(dir string) Runtime { rt = newRT(dir).(*OCI); return rt }, clock.Real{})
	c := createSpec(digest, time.Now().Add(10*time.Minute), 512)
	c.Runtime = spec.RuntimeRunsc
	c.Limits.DiskMB, c.Limits.MemoryMB = 16, 64
	mustCreate(t, h, c)
	r := execIn(t, h, c.SandboxID, 60*time.Second, "sh", "-c", "dd if=/dev/zero of=/tmp/big bs=64k count=640 2>/dev/null; wc -c < /tmp/big")
	n, err := strconv.ParseInt(strings.TrimSpace(string(r.Stdout)), 10, 64)
	if err != nil || n > 16<<20 {
		t.Fatalf("/tmp took %q bytes under a 16 MiB disk limit (%v, stderr %q)", r.Stdout, err, r.Stderr)
	}
	if h.Sweep(context.Background()); len(h.Sandboxes()) != 1 {
		t.Fatal("a live sandbox was swept")
	}
	pidText, err := os.ReadFile(filepath.Join(rt.bundle(c.SandboxID), "init.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(pidText)))
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		t.Fatalf("kill the gVisor sandbox: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(h.Sandboxes()) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the dead gVisor sandbox is still held")
		}
		h.Sweep(context.Background())
		<-time.After(50 * time.Millisecond) // poll interval

	}
	raw, _ := json.Marshal(spec.Exec{SandboxID: c.SandboxID, Argv: []string{"true"}, TimeoutMS: 5000})
	if _, err := h.Exec(context.Background(), raw); err == nil || err.Error() != "sandbox-failed" {
		t.Fatalf("exec in the dead sandbox: %v, want sandbox-failed", err)
	}
	assertGone(t, h, c.SandboxID)
}

// TestRunscHostRefusesEgress: a runsc host with egress wiring does not
// advertise egress and refuses an egress sandbox as network-unavailable
// (gVisor cannot join the link's namespace).
func TestRunscHostRefusesEgress(t *testing.T) {
	RequireRunsc(t)
	eg := RequireEgress(t)
	h, digest := testHostEgress(t, runscRuntime(t), clock.Real{}, eg)
	if h.Labels()[spec.EgressLabel] != "" {
		t.Fatalf("a runsc host advertises egress: %v", h.Labels())
	}
	c := createSpec(digest, time.Now().Add(10*time.Minute), 512)
	c.Runtime, c.Network = spec.RuntimeRunsc, spec.NetworkEgress
	raw, _ := json.Marshal(c)
	if _, err := h.Create(context.Background(), raw); err == nil || err.Error() != "network-unavailable" {
		t.Fatalf("egress on runsc: %v, want network-unavailable", err)
	}
}
