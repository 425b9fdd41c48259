package sandbox

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// runtimes are the real OCI runtimes the escape tests run on, each as a
// subtest.
var runtimes = []struct {
	name string
	rt   func(*testing.T) func(string) Runtime
}{
	{spec.RuntimeRunc, runcRuntime},
	{spec.RuntimeRunsc, runscRuntime},
}

// forEachRuntime runs f on a fresh host of runc and of runsc.
func forEachRuntime(t *testing.T, f func(t *testing.T, h *Host, c spec.Create)) {
	for _, r := range runtimes {
		t.Run(r.name, func(t *testing.T) {
			h, digest := testHost(t, r.rt(t), clock.Real{})
			// gVisor's Sentry and gofer threads count against the pids
			// limit too: give runsc room for them.
			pids := int64(64)
			if r.name == spec.RuntimeRunsc {
				pids = 512
			}
			c := createSpec(digest, time.Now().Add(10*time.Minute), pids)
			c.Runtime = r.name
			f(t, h, c)
		})
	}
}

// buildProbe builds the Go program in testdata/name for goarch, static,
// and returns the binary's path.
func buildProbe(t *testing.T, name, goarch string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), name+"-"+goarch)
	cmd := exec.Command("go", "build", "-o", out, "./testdata/"+name)
	cmd.Env = append(os.Environ(), "GOARCH="+goarch, "CGO_ENABLED=0", "GOOS=linux")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s for %s: %v\n%s", name, goarch, err, b)
	}
	return out
}

// putInSandbox copies the host file src into the running sandbox's root
// (through its overlay, as if the tenant had written it) under a fresh
// name, executable by the sandbox's user, and returns its path inside.
func putInSandbox(t *testing.T, h *Host, id, src string) string {
	t.Helper()
	o, ok := h.cfg.Runtime.(*OCI)
	if !ok {
		t.Fatal("not an OCI runtime")
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	name := "/" + ids.New("probe")
	host := filepath.Join(o.bundle(id), "rootfs", name)
	if err := os.WriteFile(host, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return name
}

// TestSeccompRefusesVsockEveryABI runs a static probe that tries to open
// and bind an AF_VSOCK socket, built for the native ABI and for the
// 32-bit x86 ABI (GOARCH=386, whose syscall package goes through
// socketcall): on runc and runsc, no attempt makes a socket. The native
// probe is refused with EPERM; the 32-bit one is killed by the filter
// (only the native architecture is allowed) or refused by gVisor.
func TestSeccompRefusesVsockEveryABI(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the 32-bit probe is for x86-64 hosts")
	}
	probes := map[string]string{}
	for _, arch := range []string{"amd64", "386"} {
		probes[arch] = buildProbe(t, "vsockprobe", arch)
	}
	// A kernel built without IA32 emulation runs no 32-bit program at all,
	// inside a sandbox or out: there the 32-bit path cannot be taken and
	// the check is that it is not (exec format error).
	host32 := !errors.Is(exec.Command(probes["386"]).Run(), syscall.ENOEXEC)
	forEachRuntime(t, func(t *testing.T, h *Host, c spec.Create) {
		mustCreate(t, h, c)
		for _, arch := range []string{"amd64", "386"} {
			p := putInSandbox(t, h, c.SandboxID, probes[arch])
			r := execIn(t, h, c.SandboxID, 30*time.Second, p)
			out := string(r.Stdout) + string(r.Stderr)
			t.Logf("%s probe: exit %d: %s", arch, r.ExitCode, strings.TrimSpace(out))
			if strings.Contains(out, "vsock created") || r.ExitCode == 0 || r.TimedOut {
				t.Fatalf("%s probe made an AF_VSOCK socket: exit %d timed out %v: %s", arch, r.ExitCode, r.TimedOut, out)
			}
			// runc's filter answers EPERM; gVisor has no AF_VSOCK at all.
			want := "socket refused: operation not permitted"
			if c.Runtime == spec.RuntimeRunsc {
				want = "socket refused: address family not supported by protocol"
			}
			if arch == "amd64" && (!strings.Contains(out, want) || !strings.Contains(out, "direct "+want)) {
				t.Fatalf("native probe was not refused (want %q): %s", want, out)
			}
			// The 32-bit ABI: runc's filter kills the process at its first
			// call (SIGSYS, 128+31); gVisor does not load a 32-bit program.
			if arch == "386" && !host32 {
				if !strings.Contains(out, "exec format error") {
					t.Fatalf("32-bit probe ran on a kernel without IA32 emulation: %s", out)
				}
				continue
			}
			if arch == "386" && c.Runtime == spec.RuntimeRunc && r.ExitCode != 159 {
				t.Fatalf("32-bit probe exit %d, want 159 (killed by SIGSYS): %s", r.ExitCode, out)
			}
			if arch == "386" && c.Runtime == spec.RuntimeRunsc && !strings.Contains(out, "exec format error") {
				t.Fatalf("32-bit probe ran under gVisor: %s", out)
			}
		}
	})
}

// hostFileBytes sums the disk space allocated to the regular files on
// the data directory's filesystem that the sandbox's host processes hold
// open (its cgroup's processes: runc's PID 1, or gVisor's sandbox
// process), deleted files included: what a write through a held
// descriptor would take from the host's disk.
func hostFileBytes(t *testing.T, h *Host, id string) int64 {
	t.Helper()
	var dataDev uint64
	var st unix.Stat_t
	if err := unix.Stat(h.cfg.Dir, &st); err != nil {
		t.Fatal(err)
	}
	dataDev = st.Dev
	pids := cgroupProcs(id)
	if len(pids) == 0 {
		t.Fatal("the sandbox's cgroup lists no process")
	}
	var total int64
	seen := map[uint64]bool{}
	for _, pid := range pids {
		fds, _ := os.ReadDir(filepath.Join("/proc", itoa(pid), "fd"))
		for _, fd := range fds {
			var fs unix.Stat_t
			if unix.Stat(filepath.Join("/proc", itoa(pid), "fd", fd.Name()), &fs) != nil {
				continue
			}
			if fs.Mode&unix.S_IFMT == unix.S_IFREG && fs.Dev == dataDev && !seen[fs.Ino] {
				seen[fs.Ino] = true
				total += fs.Blocks * 512
			}
		}
	}
	return total
}

// TestSandboxStdioNotOnHostDisk has the sandbox write to its PID 1's
// standard streams through /proc/1/fd (fallocate of 1 GiB, and dd of
// 32 MiB) on runc and runsc: the streams are /dev/null, so nothing the
// sandbox's processes hold on the host's disk grows.
func TestSandboxStdioNotOnHostDisk(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, h *Host, c spec.Create) {
		mustCreate(t, h, c)
		before := hostFileBytes(t, h, c.SandboxID)
		for _, fd := range []string{"0", "1", "2"} {
			r := execIn(t, h, c.SandboxID, 60*time.Second, "sh", "-c",
				"fallocate -l 1G /proc/1/fd/"+fd+"; dd if=/dev/zero of=/proc/1/fd/"+fd+" bs=64k count=512 2>&1; ls -l /proc/1/fd/"+fd)
			t.Logf("fd %s: exit %d: %s %s", fd, r.ExitCode, r.Stdout, r.Stderr)
		}
		after := hostFileBytes(t, h, c.SandboxID)
		if after-before > 1<<20 {
			t.Fatalf("the sandbox's writes to /proc/1/fd took %d bytes of the host's disk (before %d, after %d)", after-before, before, after)
		}
	})
}

// TestSandboxTCPMemoryCounted runs a probe in a 64 MiB sandbox that
// queues data on loopback TCP connections nobody reads (up to 512 MiB):
// the kernel's socket buffers are bounded, so the probe cannot queue more
// than the memory limit: on runc by the memory cgroup's kernel TCP limit
// (a quarter of the memory limit, cgroup v1), on runsc because gVisor's
// netstack buffers are the Sentry's memory, in the sandbox's cgroup (the
// Sentry is killed at the limit).
func TestSandboxTCPMemoryCounted(t *testing.T) {
	probe := buildProbe(t, "tcpfill", runtime.GOARCH)
	forEachRuntime(t, func(t *testing.T, h *Host, c spec.Create) {
		c.Limits.MemoryMB = 64
		mustCreate(t, h, c)
		p := putInSandbox(t, h, c.SandboxID, probe)
		r := execIn(t, h, c.SandboxID, 120*time.Second, p)
		out := strings.TrimSpace(string(r.Stdout) + string(r.Stderr))
		t.Logf("tcpfill: exit %d: %s", r.ExitCode, out)
		var queued int64 = -1
		for _, l := range strings.Split(out, "\n") {
			if n, ok := strings.CutPrefix(l, "queued "); ok {
				queued, _ = strconv.ParseInt(n, 10, 64)
			}
		}
		limit := int64(c.Limits.MemoryMB) << 20
		if queued > limit {
			t.Fatalf("the sandbox queued %d bytes on loopback sockets, over its %d-byte memory limit", queued, limit)
		}
		if c.Runtime == spec.RuntimeRunc {
			if queued < 0 {
				t.Fatalf("tcpfill reported nothing: %s", out)
			}
			cg := "/sys/fs/cgroup/memory" + CgroupParent + "/" + c.SandboxID + "/"
			if max := readIntOr(cg+"memory.kmem.tcp.limit_in_bytes", -1); int64(max) != kernelTCPLimit(c.Limits.MemoryMB) {
				t.Fatalf("memory.kmem.tcp.limit_in_bytes = %d, want %d", max, kernelTCPLimit(c.Limits.MemoryMB))
			}
		}
	})
}

// TestRuncSandboxesHaveOwnHostIDs has one runc sandbox take every inotify
// instance its user may have (128, fs.inotify.max_user_instances) and
// hold them; another sandbox, whose user is another host uid, still opens
// one. Each sandbox's processes run as its own block of host ids.
func TestRuncSandboxesHaveOwnHostIDs(t *testing.T) {
	probe := buildProbe(t, "inotifyhog", runtime.GOARCH)
	h, digest := testHost(t, runcRuntime(t), clock.Real{})
	a, b := createSpec(digest, time.Now().Add(10*time.Minute), 64), createSpec(digest, time.Now().Add(10*time.Minute), 64)
	mustCreate(t, h, a)
	mustCreate(t, h, b)
	sa, _ := h.Get(a.SandboxID)
	sb, _ := h.Get(b.SandboxID)
	if !sa.IDs.Valid() || !sb.IDs.Valid() || sa.IDs.Base == sb.IDs.Base {
		t.Fatalf("id blocks %+v and %+v", sa.IDs, sb.IDs)
	}
	// The host sees each sandbox's nobody as its own host uid.
	for _, s := range []State{sa, sb} {
		initPID := readIntOr(filepath.Join(h.cfg.Runtime.(*OCI).bundle(s.ID), "init.pid"), -1)
		st, err := os.ReadFile(filepath.Join("/proc", itoa(initPID), "status"))
		if err != nil {
			t.Fatal(err)
		}
		want := "Uid:\t" + itoa(s.IDs.Host(NobodyID))
		if !strings.Contains(string(st), want) {
			t.Fatalf("the init of %s is not host uid %d:\n%s", s.ID, s.IDs.Host(NobodyID), st)
		}
	}
	// The limits runc no longer sets are inherited: 1024 files, no core.
	limits := string(execIn(t, h, a.SandboxID, 30*time.Second, "cat", "/proc/self/limits").Stdout)
	for _, want := range []string{`Max open files\s+1024\s+1024`, `Max core file size\s+0\s+0`} {
		if !regexp.MustCompile(want).MatchString(limits) {
			t.Fatalf("/proc/self/limits lacks %s:\n%s", want, limits)
		}
	}
	pa, pb := putInSandbox(t, h, a.SandboxID, probe), putInSandbox(t, h, b.SandboxID, probe)
	execIn(t, h, a.SandboxID, 30*time.Second, "sh", "-c", pa+" 4096 hold >/dev/null 2>&1 &")
	// Wait until a's user has no instance left (a's own probe fails).
	deadline := time.Now().Add(60 * time.Second)
	for {
		r := execIn(t, h, a.SandboxID, 30*time.Second, pa, "1")
		if strings.Contains(string(r.Stdout), "opened 0") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox a never used up its inotify instances: %s", r.Stdout)
		}
	}
	r := execIn(t, h, b.SandboxID, 30*time.Second, pb, "1")
	if !strings.Contains(string(r.Stdout), "opened 1") {
		t.Fatalf("sandbox b could not open an inotify instance while a holds all of its own: %s", r.Stdout)
	}
}

// TestSandboxHidesHostPaths reads, inside a runc and a runsc sandbox,
// what the outside testers found host paths in: /proc/self/mountinfo,
// /proc/self/mounts and the links of /proc/1/fd and /proc/self/fd show
// neither the host's data folder, nor the bundle, nor the image digest;
// and /proc/config.gz (the host kernel's configuration) reads empty or
// not at all.
func TestSandboxHidesHostPaths(t *testing.T) {
	forEachRuntime(t, func(t *testing.T, h *Host, c spec.Create) {
		mustCreate(t, h, c)
		hex := strings.TrimPrefix(c.ImageDigest, "sha256:")
		for _, cmd := range []string{"cat /proc/self/mountinfo", "cat /proc/self/mounts", "ls -l /proc/1/fd/ /proc/self/fd/", "cat /proc/1/mountinfo"} {
			r := execIn(t, h, c.SandboxID, 30*time.Second, "sh", "-c", cmd)
			out := string(r.Stdout) + string(r.Stderr)
			if r.ExitCode != 0 && !strings.Contains(cmd, "fd/") {
				t.Fatalf("%s: exit %d: %s", cmd, r.ExitCode, out)
			}
			for _, secret := range []string{h.cfg.Dir, "/bundles/", hex, hex[:12]} {
				if strings.Contains(out, secret) {
					t.Fatalf("%s shows the host's %q:\n%s", cmd, secret, out)
				}
			}
		}
		r := execIn(t, h, c.SandboxID, 30*time.Second, "sh", "-c", "cat /proc/config.gz | wc -c")
		if n := strings.TrimSpace(string(r.Stdout)); n != "0" {
			t.Fatalf("/proc/config.gz reads %s bytes", n)
		}
	})
}

// TestRuncRootTemplateInUserNS runs a root template on runc: root inside
// owns the image's files (the id-mapped image) and can write them, but
// is the sandbox's own host id, not the host's root, and still has no
// capabilities.
func TestRuncRootTemplateInUserNS(t *testing.T) {
	h, digest := testHost(t, runcRuntime(t), clock.Real{})
	c := createSpec(digest, time.Now().Add(10*time.Minute), 64)
	c.Root = true
	mustCreate(t, h, c)
	st, _ := h.Get(c.SandboxID)
	if r := execIn(t, h, c.SandboxID, 30*time.Second, "sh", "-c", "id -u; stat -c %u /etc; echo x > /etc/bc-root-test && cat /etc/bc-root-test"); string(r.Stdout) != "0\n0\nx\n" {
		t.Fatalf("root inside: %q %q", r.Stdout, r.Stderr)
	}
	initPID := readIntOr(filepath.Join(h.cfg.Runtime.(*OCI).bundle(c.SandboxID), "init.pid"), -1)
	status, err := os.ReadFile(filepath.Join("/proc", itoa(initPID), "status"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "Uid:\t" + itoa(st.IDs.Host(0)) + "\t"; !strings.Contains(string(status), want) {
		t.Fatalf("the root sandbox's init is not host uid %d:\n%s", st.IDs.Host(0), status)
	}
	if !strings.Contains(string(execIn(t, h, c.SandboxID, 30*time.Second, "cat", "/proc/self/status").Stdout), "CapEff:\t0000000000000000") {
		t.Fatal("root inside has capabilities")
	}
}
