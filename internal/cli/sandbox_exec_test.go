package cli_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/sandboxes/imagetar"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// execRuntime is runc when it can run here (root, runc, busybox), else
// sim; BC_REQUIRE_RUNC=1 makes its absence a failure.
func execRuntime(t *testing.T) (string, []byte) {
	t.Helper()
	_, err := exec.LookPath("runc")
	bb, bbErr := imagetar.Busybox()
	if err == nil && bbErr == nil && os.Geteuid() == 0 {
		return spec.RuntimeRunc, bb
	}
	if os.Getenv("BC_REQUIRE_RUNC") == "1" {
		t.Fatalf("runc required (BC_REQUIRE_RUNC=1): runc %v, root %v, busybox %v", err, os.Geteuid() == 0, bbErr)
	}
	dir := t.TempDir()
	if err := os.MkdirAll(dir+"/bin", 0o755); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := imagetar.FromDir(dir, &buf); err != nil {
		t.Fatal(err)
	}
	return spec.RuntimeSim, buf.Bytes()
}

// sandbox exec exits as docker exec does: the program's own status; 127
// for a program not found and 126 for one that cannot be executed, each
// with one clear line; 125 for every failure of the CLI or the server
// (usage, no API, a missing sandbox, a refused input).
func TestSandboxExecExitCodes(t *testing.T) {
	rt, image := execRuntime(t)
	t.Logf("runtime %s", rt)
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Nodes: 1, SandboxRuntime: rt})
	ctx := context.Background()
	if _, err := e.CP.Sandboxes.ImportBytes(ctx, audit.Entry{TenantID: "root", Actor: "test"}, "root", "busybox", image); err != nil {
		t.Fatalf("import: %v", err)
	}
	if err := e.Client.Call(ctx, "templates.create", map[string]any{"name": "small", "image": "busybox", "runtime": rt,
		"limits": map[string]any{"cpu_millis": 500, "memory_mb": 128, "pids": 64, "disk_mb": 32}, "lifetime_seconds": 600}, nil); err != nil {
		t.Fatalf("template: %v", err)
	}
	x, err := e.Client.CreateSandbox(ctx, "", "small")
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Setenv("BC_ADDR", "http://"+e.CP.APIAddr)
	t.Setenv("BC_API_KEY", e.AdminKey)
	type want struct {
		code   int
		stderr string // a substring of stderr
	}
	cases := map[string]struct {
		args []string
		want want
	}{
		"own 0":             {[]string{"sandbox", "exec", x.ID, "--", "true"}, want{0, ""}},
		"own 1":             {[]string{"sandbox", "exec", x.ID, "--", "false"}, want{1, ""}},
		"not found":         {[]string{"sandbox", "exec", x.ID, "--", "no-such-program"}, want{127, "no-such-program"}},
		"missing sandbox":   {[]string{"sandbox", "exec", "sbxaaaaaaaaaaaaaaaa", "--", "true"}, want{125, "error: NOT_FOUND"}},
		"no dash":           {[]string{"sandbox", "exec", x.ID, "true"}, want{125, "error: usage: sandbox exec ID -- ARGV..."}},
		"no argv":           {[]string{"sandbox", "exec", x.ID}, want{125, "error: "}},
		"unknown flag":      {[]string{"sandbox", "exec", "--bogus", x.ID, "--", "true"}, want{125, "error: "}},
		"timeout too large": {[]string{"sandbox", "exec", "--timeout", "20m", x.ID, "--", "true"}, want{125, "error: INVALID_INPUT"}},
	}
	if rt == spec.RuntimeRunc {
		cases["own 3"] = struct {
			args []string
			want want
		}{[]string{"sandbox", "exec", x.ID, "--", "sh", "-c", "exit 3"}, want{3, ""}}
		cases["not executable"] = struct {
			args []string
			want want
		}{[]string{"sandbox", "exec", x.ID, "--", "/etc/passwd"}, want{126, `"/etc/passwd": cannot be executed in the sandbox: permission denied`}}
	}
	for name, tc := range cases {
		code, _, errOut := run(t, tc.args...)
		if code != tc.want.code || !strings.Contains(errOut, tc.want.stderr) {
			t.Errorf("%s: exit %d, stderr %q; want %d and %q", name, code, errOut, tc.want.code, tc.want.stderr)
		}
		if strings.Contains(errOut, "level=") || strings.Count(errOut, "\n") > 1 {
			t.Errorf("%s: stderr is not one clear line: %q", name, errOut)
		}
	}
	t.Setenv("BC_ADDR", "")
	if code, _, errOut := run(t, "sandbox", "exec", x.ID, "--", "true"); code != 125 || !strings.Contains(errOut, "BC_ADDR") {
		t.Errorf("without BC_ADDR: exit %d %q, want 125", code, errOut)
	}
}
