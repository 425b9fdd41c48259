package sandboxops_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/daemon/sandbox"
	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
	"github.com/bettercompute/bettercompute/internal/hosthelper/sandboxops"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/sandboxes/imagetar"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// requireRunc skips unless runc is installed, the test runs as root and a
// static busybox makes the image; with BC_REQUIRE_RUNC=1 it fails instead
// (as internal/daemon/sandbox's RequireRunc).
func requireRunc(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("runc")
	why := ""
	switch {
	case err != nil:
		why = "runc is not installed"
	case os.Geteuid() != 0:
		why = "runc sandboxes need root"
	}
	if why == "" {
		if _, err := imagetar.BusyboxPath(); err != nil {
			why = err.Error()
		}
	}
	if why != "" {
		if os.Getenv("BC_REQUIRE_RUNC") == "1" {
			t.Fatalf("runc required (BC_REQUIRE_RUNC=1): %s", why)
		}
		t.Skipf("RUNC TEST NOT RUN: %s (set BC_REQUIRE_RUNC=1 to make this fatal)", why)
	}
	return p
}

// inProcess is the helper's socket, minus the socket: each call goes
// through the JSON the wire carries to the Ops handler, and an error that
// is not a refusal becomes CodeFailed, as the helper's server answers.
type inProcess struct {
	ops   *sandboxops.Ops
	calls int
}

func (c *inProcess) Call(ctx context.Context, r *helperwire.Request) (json.RawMessage, error) {
	c.calls++
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	var got helperwire.Request
	if err := json.Unmarshal(b, &got); err != nil {
		return nil, err
	}
	h, ok := c.ops.Handlers()[got.Op]
	if !ok {
		return nil, &helperwire.Refusal{Code: helperwire.CodeUnknownOp}
	}
	res, err := h(ctx, &got)
	var ref *helperwire.Refusal
	if err != nil && !errors.As(err, &ref) {
		return nil, &helperwire.Refusal{Code: helperwire.CodeFailed, Reason: "failed"}
	}
	return res, err
}

// killSandbox SIGKILLs every process in the sandbox's cgroup, as a kernel
// limit or a crash would end it.
func killSandbox(t *testing.T, id string) {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	n := 0
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(b, []byte(sandbox.CgroupParent+"/"+id)) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			n++
		}
	}
	if n == 0 {
		t.Fatalf("no process of sandbox %s found", id)
	}
}

// TestRuncSandboxThroughHelper: the node side (HelperDriver, holding no
// sandbox host) runs signed sandbox commands only through the helper's
// operations, which verify each one and run it on a real runc host: a
// sandbox is created, `echo hi` runs in it and its output comes back, a
// sandbox whose processes die is reported to the node through
// sandbox.failures exactly once, and delete removes it (and clears the
// failure). The host's labels reach the node through sandbox.labels.
// Without the signed command in its context the node side calls nothing.
func TestRuncSandboxThroughHelper(t *testing.T) {
	bin := requireRunc(t)
	tarball, err := imagetar.Busybox()
	if err != nil {
		t.Fatal(err)
	}
	store, digest := imageStore(t, tarball)
	now := time.Now()
	clk := clock.NewFake(now)
	host := openHost(t, func(dir string) sandbox.Runtime {
		o, err := sandbox.NewOCI(spec.RuntimeRunc, bin, dir)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}, store, clk)
	s := newSigner(t, now)
	client := &inProcess{ops: newOps(t, host, t.TempDir(), clk, fixed(s.trust()))}
	node := &sandbox.HelperDriver{Driver: driver.NewSim("n1"), Client: client, Intent: func() []byte { return []byte("intent") }}
	ctx := context.Background()
	run := func(kind string, payload any) ([]byte, error) {
		cmd := s.command(t, now, "n1", kind, payload, nil)
		p, _ := json.Marshal(payload)
		return node.Run(driver.WithCommand(ctx, cmd), kind, p)
	}

	if l := node.Labels(); l[spec.RuntimeLabel(spec.RuntimeRunc)] != "true" {
		t.Fatalf("labels through the helper: %v", l)
	}
	c := createPayload(digest, spec.RuntimeRunc, now.Add(time.Hour))
	if _, err := run(kinds.SandboxCreate, c); err != nil {
		t.Fatalf("create: %v", err)
	}
	out, err := run(kinds.SandboxExec, spec.Exec{SandboxID: c.SandboxID, Argv: []string{"echo", "hi"}, TimeoutMS: 30_000})
	var res spec.ExecResult
	if err != nil || json.Unmarshal(out, &res) != nil || res.ExitCode != 0 || string(res.Stdout) != "hi\n" {
		t.Fatalf("exec: %s (%v)", out, err)
	}

	before := client.calls
	p, _ := json.Marshal(spec.Exec{SandboxID: c.SandboxID, Argv: []string{"echo", "hi"}, TimeoutMS: 1000})
	if _, err := node.Run(ctx, kinds.SandboxExec, p); !errors.Is(err, sandbox.ErrNoSignedCommand) || client.calls != before {
		t.Fatalf("exec without a signed command: %v, %d helper calls", err, client.calls-before)
	}

	var told []string
	node.OnSandboxFailed(func(id, reason string) { told = append(told, id+" "+reason) })
	killSandbox(t, c.SandboxID)
	// The kernel ends the killed processes asynchronously: sweep and poll
	// until the failure is told (the sweep runs every second in bcd),
	// then poll once more, which must not tell it again.
	deadline := time.Now().Add(10 * time.Second)
	for len(told) == 0 && time.Now().Before(deadline) {
		host.Sweep(ctx)
		if err := node.PollFailures(ctx); err != nil {
			t.Fatal(err)
		}
		if len(told) == 0 {
			<-time.After(50 * time.Millisecond) // poll interval
		}
	}
	if err := node.PollFailures(ctx); err != nil {
		t.Fatal(err)
	}
	if len(told) != 1 || told[0] != c.SandboxID+" "+sandbox.ReasonRuntimeDied {
		t.Fatalf("failures told: %v", told)
	}
	if _, err := run(kinds.SandboxDelete, spec.Delete{SandboxID: c.SandboxID}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if got := host.Sandboxes(); len(got) != 0 {
		t.Fatalf("sandboxes left: %v", got)
	}
	raw, err := client.ops.Failures(ctx, req(helperwire.OpSandboxFailures, nil))
	if err != nil || !strings.Contains(string(raw), `"failures":[]`) {
		t.Fatalf("failures after delete: %s (%v)", raw, err)
	}
	if _, err := node.OpenShell(ctx, c.SandboxID, []string{"sh"}); !errors.Is(err, driver.ErrShellUnsupported) {
		t.Fatalf("OpenShell: %v", err)
	}
}
