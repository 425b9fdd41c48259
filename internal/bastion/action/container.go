package action

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/bettercompute/bettercompute/internal/daemon/sandbox"
)

// Container limits of a dry run.
const (
	// nobody is the uid and gid the program runs as.
	nobody = 65534
	// MaxOutputBytes is how much of each of stdout and stderr a plan keeps.
	MaxOutputBytes = 64 << 10
	memoryLimit    = 256 << 20
	pidsLimit      = 128
	fileSizeLimit  = MaxEffectBytes * 2
	// cgroupParent holds every dry run's cgroup.
	cgroupParent = "/bcaction"
)

// Kernel interfaces a container has no business with.
var (
	maskedPaths = []string{"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
		"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
		"/sys/devices/virtual/powercap", "/proc/config.gz", "/proc/kallsyms", "/proc/modules", "/proc/cmdline"}
	readonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
)

// runDirs are the host folders of one dry run.
type runDirs struct {
	bundle string // config.json
	rootfs string // the image (read-only in the container)
	work   string // the effects' copies, at /work
	inputs string // the fetched inputs, at /inputs (read-only)
	action string // the script, at /action (read-only)
}

// containerSpec is the OCI configuration of a dry run: the image as a
// read-only root, /work read-write, /inputs and /action read-only, a
// small /tmp; new pid, ipc, uts, mount and network namespaces (the
// network one fresh, so only loopback); nobody with no capabilities and
// no new privileges; rlimits, cgroup limits and the sandbox host's
// seccomp filter.
func containerSpec(d runDirs, cid string) *specs.Spec {
	noCaps := &specs.LinuxCapabilities{Bounding: []string{}, Effective: []string{}, Permitted: []string{}, Inheritable: []string{}, Ambient: []string{}}
	ro, rw := []string{"rbind", "ro", "nosuid", "nodev"}, []string{"rbind", "rw", "nosuid", "nodev"}
	memory, pids := int64(memoryLimit), int64(pidsLimit)
	return &specs.Spec{
		Version:  specs.Version,
		Root:     &specs.Root{Path: d.rootfs, Readonly: true},
		Hostname: "action",
		Process: &specs.Process{
			User: specs.User{UID: nobody, GID: nobody, AdditionalGids: []uint32{nobody}},
			Args: []string{"/bin/sh", "/action/script.sh"}, Env: []string{"PATH=/bin", "HOME=/tmp"}, Cwd: "/work",
			Capabilities: noCaps, NoNewPrivileges: true,
			Rlimits: []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 256, Soft: 256}, {Type: "RLIMIT_CORE"},
				{Type: "RLIMIT_FSIZE", Hard: fileSizeLimit, Soft: fileSizeLimit}},
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=1024k"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777", "size=16m"}},
			{Destination: "/work", Type: "bind", Source: d.work, Options: rw},
			{Destination: "/inputs", Type: "bind", Source: d.inputs, Options: ro},
			{Destination: "/action", Type: "bind", Source: d.action, Options: ro},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace}, {Type: specs.NetworkNamespace}},
			CgroupsPath: cgroupParent + "/" + cid,
			Resources: &specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
				Memory:  &specs.LinuxMemory{Limit: &memory},
				Pids:    &specs.LinuxPids{Limit: &pids},
			},
			Seccomp:       sandbox.SeccompProfile(),
			MaskedPaths:   maskedPaths,
			ReadonlyPaths: readonlyPaths,
		},
	}
}

// runResult is what a run produced.
type runResult struct {
	ExitCode int
	Stdout   string
	Stderr   string
	TimedOut bool
}

// runtimeArgs returns the runtime's argv: its state root and its global
// flags (runsc: the ptrace platform and no network at all), then args.
func (r *Runner) runtimeArgs(args ...string) []string {
	out := []string{"--root", filepath.Join(r.stateDir, r.runtime+"-state")}
	if r.runtime == RuntimeRunsc {
		out = append(out, "--platform=ptrace", "--network=none")
	}
	return append(out, args...)
}

// runContainer writes the bundle's config and runs the container in the
// foreground under the run timeout; the container is killed when the
// timeout or ctx ends, and deleted in every case.
func (r *Runner) runContainer(ctx context.Context, binary string, d runDirs, cid string) (runResult, error) {
	raw, err := json.Marshal(containerSpec(d, cid))
	if err != nil {
		return runResult{}, fmt.Errorf("action: container config: %w", err)
	}
	if err := os.WriteFile(filepath.Join(d.bundle, "config.json"), raw, 0o600); err != nil {
		return runResult{}, fmt.Errorf("action: container config: %w", err)
	}
	defer r.runtimeQuiet(binary, "delete", "--force", cid)
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	logPath := filepath.Join(d.bundle, "runtime.log")
	cmd := exec.CommandContext(ctx, binary, r.runtimeArgs("--log", logPath, "run", "--bundle", d.bundle, cid)...)
	stdout, stderr := &capped{max: MaxOutputBytes}, &capped{max: MaxOutputBytes}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, stdout, stderr
	cmd.Cancel = func() error { r.runtimeQuiet(binary, "kill", cid, "KILL"); return cmd.Process.Kill() }
	cmd.WaitDelay = 10 * time.Second
	werr := cmd.Run()
	res := runResult{Stdout: stdout.String(), Stderr: stderr.String(), TimedOut: ctx.Err() != nil}
	var ee *exec.ExitError
	switch {
	case werr == nil:
	case errors.As(werr, &ee):
		res.ExitCode = ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			res.ExitCode = 128 + int(ws.Signal())
		}
	default:
		return res, fmt.Errorf("action: %s run: %w", r.runtime, werr)
	}
	if lg, _ := os.ReadFile(logPath); bytes.Contains(lg, []byte("level=error")) || bytes.Contains(lg, []byte(`"level":"error"`)) {
		return res, fmt.Errorf("action: %s run failed: %s", r.runtime, tailString(string(lg), 512))
	}
	return res, nil
}

// runtimeQuiet runs a runtime command that cleans up (kill, delete) under
// its own short deadline, ignoring its outcome.
func (r *Runner) runtimeQuiet(binary string, args ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = exec.CommandContext(ctx, binary, r.runtimeArgs(args...)...).Run()
}

// tailString returns at most the last n bytes of s, trimmed.
func tailString(s string, n int) string {
	if len(s) > n {
		s = s[len(s)-n:]
	}
	return strings.TrimSpace(s)
}

// capped keeps the first max bytes written and drops the rest, so a
// program writing without end never blocks nor grows memory.
type capped struct {
	buf bytes.Buffer
	max int
}

// Write keeps what fits and reports everything written.
func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.buf.Len(); room > 0 {
		c.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// String returns what was kept.
func (c *capped) String() string { return c.buf.String() }
