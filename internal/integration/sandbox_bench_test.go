package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/api"
	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/daemon/sandbox"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
	"github.com/bettercompute/bettercompute/internal/sandboxes/imagetar"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
	"github.com/bettercompute/bettercompute/internal/server"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// BenchmarkSandboxLatency measures, on runc, BC_SANDBOX_BENCH_N (default
// 100) of each: a cold sandboxes.create through the whole system (API,
// signing, gateway, bcd verification, image cache, bundle, runc), a
// create claiming a warm sandbox (beside the API's own no-op read,
// identities.whoami, in the same position: after an exec when the claim
// is made alone, back to back beside claims back to back; and after a
// pause, a call to an idle machine), and an exec round trip (echo), each
// beside the raw runtime doing the same on the same image in the same run
// (the bundle, overlay and `runc run -d`; `runc exec`). Run it with
// bench/sandbox/run; it reports medians and p99s in milliseconds.
func BenchmarkSandboxLatency(b *testing.B) {
	bin, ok := sandbox.Usable(spec.RuntimeRunc)
	if !ok {
		b.Skip("runc is not usable (installed, root)")
	}
	tarball, err := imagetar.Busybox()
	if err != nil {
		b.Skip(err)
	}
	n := 100
	if v, err := strconv.Atoi(os.Getenv("BC_SANDBOX_BENCH_N")); err == nil && v > 0 {
		n = v
	}
	ctx := context.Background()
	e := testenv.Start(b, storetest.NewTestSQLite(b), testenv.Options{Nodes: 1, SandboxRuntime: spec.RuntimeRunc,
		// The benchmark measures latency, not the per-identity rate limit.
		Tune: func(o *server.Options) {
			o.RateLimits = api.RateLimits{ReadPerSecond: 1e6, ReadBurst: 1e6, MutatePerSecond: 1e6, MutateBurst: 1e6}
		}})
	tenant, key, admin := benchTenantAdmin(b, e, "bench")
	sb := e.CP.Sandboxes
	img, err := sb.ImportBytes(ctx, audit.Entry{TenantID: tenant, Actor: "bench"}, tenant, "busybox", tarball)
	if err != nil {
		b.Fatal(err)
	}
	limits := spec.Limits{CPUMillis: 500, MemoryMB: 64, Pids: 64, DiskMB: 16}
	const warmPool = 30
	for _, tp := range []sandboxes.TemplateIn{{Name: "cold", Image: "busybox", Limits: limits}, {Name: "warm", Image: "busybox", Limits: limits, Warm: warmPool}} {
		if _, err := sb.CreateTemplate(ctx, audit.Entry{TenantID: tenant, Actor: "bench"}, tenant, tp); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()

	// The raw runtime on the same image, unpacked by the same code.
	dir, err := os.MkdirTemp("", "bcbench-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	store := "file://" + filepath.Join(e.Dir, "objects")
	im, err := sandbox.OpenImages(ctx, store, filepath.Join(dir, "images"))
	if err != nil {
		b.Fatal(err)
	}
	defer im.Close()
	lower, err := im.Ensure(ctx, img.Digest)
	if err != nil {
		b.Fatal(err)
	}
	oci, err := sandbox.NewOCI(spec.RuntimeRunc, bin, filepath.Join(dir, "rt"))
	if err != nil {
		b.Fatal(err)
	}
	rawSpec := func() spec.Create {
		return spec.Create{SandboxID: ids.New("sbx"), ImageDigest: img.Digest, Runtime: spec.RuntimeRunc, Limits: limits, Network: spec.NetworkNone,
			DeadlineMS: time.Now().Add(time.Hour).UnixMilli()}
	}
	var rawRun, rawExec, cold, warm, execRT, noop []time.Duration
	for i := 0; i < n; i++ {
		c := rawSpec()
		t0 := time.Now()
		if err := oci.Start(ctx, c, sandbox.Placement{Lower: lower}); err != nil {
			b.Fatal(err)
		}
		rawRun = append(rawRun, time.Since(t0))
		if err := oci.Remove(ctx, c.SandboxID); err != nil {
			b.Fatal(err)
		}
	}
	c := rawSpec()
	if err := oci.Start(ctx, c, sandbox.Placement{Lower: lower}); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < n; i++ {
		t0 := time.Now()
		r, err := oci.Exec(ctx, c.SandboxID, []string{"echo", "hi"}, nil, false)
		if err != nil || string(r.Stdout) != "hi\n" {
			b.Fatalf("raw exec: %+v %v", r, err)
		}
		rawExec = append(rawExec, time.Since(t0))
	}
	_ = oci.Remove(ctx, c.SandboxID)

	for i := 0; i < n; i++ {
		t0 := time.Now()
		x, err := admin.CreateSandbox(ctx, "", "cold")
		if err != nil {
			b.Fatal(err)
		}
		cold = append(cold, time.Since(t0))
		if _, err := admin.DeleteSandbox(ctx, x.ID); err != nil {
			b.Fatal(err)
		}
	}
	x, err := admin.CreateSandbox(ctx, "", "cold")
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < n; i++ {
		t0 := time.Now()
		r, err := admin.Exec(ctx, x.ID, []string{"echo", "hi"}, 10)
		if err != nil || string(r.Stdout) != "hi\n" {
			b.Fatalf("exec: %+v %v", r, err)
		}
		execRT = append(execRT, time.Since(t0))
	}
	_, _ = admin.DeleteSandbox(ctx, x.ID)

	// Warm claims in batches: the pool is refilled between batches, not
	// during them (a refill's creates would compete with the claims for
	// the host and the CPU). They are timed, as the no-op read beside
	// them, from another process (startBenchClient), as a caller makes
	// them.
	sb.HoldWarmRefill(true)
	tpl, _ := sb.Template(ctx, iam.ScopeOf(tenant), "warm")
	bc := startBenchClient(b, admin.BaseURL, key)
	// Each claim alone: the client waits for the host to apply it (an
	// exec waits for that) outside the timing.
	warm, claimed := refillAndClaim(b, sb, admin, bc, tpl.ID, warmPool, n, nil, true)
	// Then batches of claims back to back, each while the host still
	// applies the ones before it.
	burst, claimed := refillAndClaim(b, sb, admin, bc, tpl.ID, warmPool, n, claimed, false)
	for _, id := range claimed {
		_, _ = admin.DeleteSandbox(ctx, id)
	}
	// The API's own no-op read (identities.whoami), the floor of any call:
	// back to back; each after an untimed exec, as a claim made alone
	// follows one (the processes' caches and the machine's idle CPUs are
	// then as a claim finds them); and each after a pause of 30 ms, a call
	// to an idle machine.
	noop, _ = bc.do(b, benchOp{Op: "noop", N: n})
	x, err = admin.CreateSandbox(ctx, "", "cold")
	if err != nil {
		b.Fatal(err)
	}
	noopExec, _ := bc.do(b, benchOp{Op: "noop", N: n, AfterExec: x.ID})
	_, _ = admin.DeleteSandbox(ctx, x.ID)
	noopIdle, _ := bc.do(b, benchOp{Op: "noop", N: n, Pause: 30})
	b.StopTimer()
	report := func(name string, d []time.Duration) {
		med, p99 := pct(d, 50), pct(d, 99)
		b.ReportMetric(float64(med.Microseconds())/1000, name+"-median-ms")
		b.ReportMetric(float64(p99.Microseconds())/1000, name+"-p99-ms")
		fmt.Printf("%-28s n=%d median=%.2fms p99=%.2fms\n", name, len(d), float64(med.Microseconds())/1000, float64(p99.Microseconds())/1000)
	}
	report("raw-runc-run", rawRun)
	report("create-cold", cold)
	report("create-warm", warm)
	report("create-warm-burst", burst)
	report("api-noop-read", noop)
	report("api-noop-after-exec", noopExec)
	report("api-noop-after-pause", noopIdle)
	report("raw-runc-exec", rawExec)
	report("exec-roundtrip", execRT)
	if out, err := exec.Command(bin, "--version").Output(); err == nil {
		fmt.Printf("%s", out)
	}
}

// refillAndClaim times n warm claims of template tpl made by the client bc
// in batches of pool, refilling the pool between batches, each claim
// followed (untimed) by the host's answer when wait is set; claimed are
// sandboxes to delete first. It returns the timings and the sandboxes of
// the last batch, not deleted.
func refillAndClaim(b *testing.B, sb *sandboxes.Service, admin *client.Client, bc *benchClient, tpl string, pool, n int, claimed []string, wait bool) ([]time.Duration, []string) {
	ctx := context.Background()
	var out []time.Duration
	for len(out) < n {
		for {
			if _, err := sb.ReconcileWarm(ctx); err != nil {
				b.Fatal(err)
			}
			if have, _ := sb.WarmCount(ctx, tpl); have >= pool {
				break
			}
		}
		for _, id := range claimed {
			_, _ = admin.DeleteSandbox(ctx, id)
		}
		d, ids := bc.do(b, benchOp{Op: "claim", N: min(pool, n-len(out)), Template: "warm", Wait: wait})
		out, claimed = append(out, d...), ids
	}
	return out, claimed
}

// pct returns the p-th percentile (nearest rank) of d.
func pct(d []time.Duration, p int) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	k := (p*len(s) + 99) / 100
	if k < 1 {
		k = 1
	}
	return s[k-1]
}
