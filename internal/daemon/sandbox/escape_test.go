package sandbox

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

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
			c := createSpec(digest, time.Now().Add(10*time.Minute), 64)
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
			if arch == "386" && c.Runtime == spec.RuntimeRunc && r.ExitCode != 159 {
				t.Fatalf("32-bit probe exit %d, want 159 (killed by SIGSYS): %s", r.ExitCode, out)
			}
			if arch == "386" && c.Runtime == spec.RuntimeRunsc && !strings.Contains(out, "exec format error") {
				t.Fatalf("32-bit probe ran under gVisor: %s", out)
			}
		}
	})
}
