package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/daemon/sandbox"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
	"github.com/bettercompute/bettercompute/internal/sandboxes/imagetar"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// ckptLayerScript writes the layer the checkpoint benchmark captures:
// 4 MiB of random bytes (incompressible) and 1.2 MB of text.
const ckptLayerScript = "mkdir -p /tmp/work && dd if=/dev/urandom of=/tmp/work/r bs=1M count=4 2>/dev/null && seq 1 200000 > /tmp/work/s"

// BenchmarkSandboxCheckpoint measures, BC_SANDBOX_BENCH_N times (default
// 10) each, in one run: sandboxes.checkpoint of a runc sandbox's writable
// layer (pause, zstd tar, digest, object store) beside a plain `tar -c`
// of the same layer contents; a restore (sandboxes.create
// --from-checkpoint: verify, extract through os.Root, start) beside a cold
// create of the same template plus a plain `tar -x`; and on runsc a
// memory checkpoint and its restore beside the raw `runsc checkpoint`,
// `runsc delete` and `runsc restore` of a container started by the same
// driver. Run it with bench/sandbox/run; it reports medians in ms.
func BenchmarkSandboxCheckpoint(b *testing.B) {
	runcBin, ok := sandbox.Usable(spec.RuntimeRunc)
	if !ok {
		b.Skip("runc is not usable (installed, root)")
	}
	runscBin, ok := sandbox.Usable(spec.RuntimeRunsc)
	if !ok {
		b.Skip("runsc is not usable")
	}
	tarball, err := imagetar.Busybox()
	if err != nil {
		b.Skip(err)
	}
	n := 10
	if v, err := strconv.Atoi(os.Getenv("BC_SANDBOX_BENCH_N")); err == nil && v > 0 {
		n = v
	}
	ctx := context.Background()
	e := testenv.Start(b, storetest.NewTestSQLite(b), testenv.Options{Nodes: 1, SandboxRuntime: "runc,runsc"})
	tenant, admin := e.TenantAdmin(b, "bench")
	img, err := e.CP.Sandboxes.ImportBytes(ctx, audit.Entry{TenantID: tenant, Actor: "bench"}, tenant, "busybox", tarball)
	if err != nil {
		b.Fatal(err)
	}
	limits := spec.Limits{CPUMillis: 1000, MemoryMB: 128, Pids: 64, DiskMB: 64}
	for _, tp := range []sandboxes.TemplateIn{{Name: "ck", Image: "busybox", Runtime: spec.RuntimeRunc, Limits: limits},
		{Name: "ckm", Image: "busybox", Runtime: spec.RuntimeRunsc, Limits: limits}} {
		if _, err := e.CP.Sandboxes.CreateTemplate(ctx, audit.Entry{TenantID: tenant, Actor: "bench"}, tenant, tp); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	m := map[string][]time.Duration{}
	benchLayer(b, e, admin, img.Digest, runcBin, limits, n, m)
	benchMemory(b, e, admin, img.Digest, runscBin, limits, n, m)
	b.StopTimer()
	for _, name := range []string{"plain-tar-c", "checkpoint-layer", "cold-create", "plain-tar-x", "restore-layer",
		"raw-runsc-ckpt-restore", "checkpoint-memory", "restore-memory"} {
		d := m[name]
		fmt.Printf("%-28s n=%d median=%.2fms p99=%.2fms\n", name, len(d), float64(pct(d, 50).Microseconds())/1000, float64(pct(d, 99).Microseconds())/1000)
	}
}

// timed appends how long f took to m[name].
func timed(b *testing.B, m map[string][]time.Duration, name string, f func() error) {
	t0 := time.Now()
	if err := f(); err != nil {
		b.Fatalf("%s: %v", name, err)
	}
	m[name] = append(m[name], time.Since(t0))
}

// rawOCI starts a raw container of the image on runtime name (the same
// driver code, no control plane) and writes the benchmark's layer in it.
func rawOCI(b *testing.B, e *testenv.Env, digest, name, bin string, limits spec.Limits) (*sandbox.OCI, string, string) {
	ctx := context.Background()
	dir := b.TempDir()
	im, err := sandbox.OpenImages(ctx, "file://"+filepath.Join(e.Dir, "objects"), filepath.Join(dir, "images"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { im.Close() })
	lower, err := im.Ensure(ctx, digest)
	if err != nil {
		b.Fatal(err)
	}
	oci, err := sandbox.NewOCI(name, bin, filepath.Join(dir, "rt"))
	if err != nil {
		b.Fatal(err)
	}
	c := spec.Create{SandboxID: ids.New("sbx"), ImageDigest: digest, Runtime: name, Limits: limits, Network: spec.NetworkNone,
		DeadlineMS: time.Now().Add(time.Hour).UnixMilli()}
	if err := oci.Start(ctx, c, sandbox.Placement{Lower: lower}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = oci.Remove(context.Background(), c.SandboxID) })
	if r, err := oci.Exec(ctx, c.SandboxID, []string{"sh", "-c", ckptLayerScript}, nil, false); err != nil || r.ExitCode != 0 {
		b.Fatalf("raw layer: %+v %v", r, err)
	}
	return oci, c.SandboxID, dir
}

// layeredSandbox creates a sandbox of template and writes the benchmark's
// layer in it.
func layeredSandbox(b *testing.B, admin *client.Client, template string) client.Sandbox {
	ctx := context.Background()
	x, err := admin.CreateSandbox(ctx, "", template)
	if err != nil {
		b.Fatal(err)
	}
	if r, err := admin.Exec(ctx, x.ID, []string{"sh", "-c", ckptLayerScript}, 30); err != nil || r.ExitCode != 0 {
		b.Fatalf("layer: %+v %v", r, err)
	}
	return x
}

// benchLayer measures layer checkpoints and restores on runc.
func benchLayer(b *testing.B, e *testenv.Env, admin *client.Client, digest, bin string, limits spec.Limits, n int, m map[string][]time.Duration) {
	ctx := context.Background()
	oci, raw, dir := rawOCI(b, e, digest, spec.RuntimeRunc, bin, limits)
	layer, err := oci.LayerDir(raw)
	if err != nil {
		b.Fatal(err)
	}
	tarFile := filepath.Join(dir, "layer.tar")
	x := layeredSandbox(b, admin, "ck")
	var ck checkpointOut
	for i := 0; i < n; i++ {
		timed(b, m, "plain-tar-c", func() error { return exec.Command("tar", "-cf", tarFile, "-C", layer, ".").Run() })
		timed(b, m, "checkpoint-layer", func() error {
			return admin.Call(ctx, "sandboxes.checkpoint", map[string]any{"id": x.ID}, &ck)
		})
	}
	for i := 0; i < n; i++ {
		var y client.Sandbox
		timed(b, m, "cold-create", func() (err error) { y, err = admin.CreateSandbox(ctx, "", "ck"); return err })
		_, _ = admin.DeleteSandbox(ctx, y.ID)
		out := filepath.Join(dir, "x"+strconv.Itoa(i))
		if err := os.Mkdir(out, 0o700); err != nil {
			b.Fatal(err)
		}
		timed(b, m, "plain-tar-x", func() error { return exec.Command("tar", "-xf", tarFile, "-C", out).Run() })
		timed(b, m, "restore-layer", func() error {
			return admin.Call(ctx, "sandboxes.create", map[string]any{"from_checkpoint": ck.ID}, &y)
		})
		_, _ = admin.DeleteSandbox(ctx, y.ID)
	}
	_, _ = admin.DeleteSandbox(ctx, x.ID)
}

// benchMemory measures memory checkpoints and restores on runsc.
func benchMemory(b *testing.B, e *testenv.Env, admin *client.Client, digest, bin string, limits spec.Limits, n int, m map[string][]time.Duration) {
	ctx := context.Background()
	oci, raw, dir := rawOCI(b, e, digest, spec.RuntimeRunsc, bin, limits)
	x := layeredSandbox(b, admin, "ckm")
	var ck checkpointOut
	for i := 0; i < n; i++ {
		img := filepath.Join(dir, "mem"+strconv.Itoa(i))
		timed(b, m, "raw-runsc-ckpt-restore", func() error {
			return oci.CheckpointMemory(ctx, raw, img, func() error { return nil })
		})
		timed(b, m, "checkpoint-memory", func() error {
			return admin.Call(ctx, "sandboxes.checkpoint", map[string]any{"id": x.ID, "memory": true}, &ck)
		})
	}
	for i := 0; i < n; i++ {
		var y client.Sandbox
		timed(b, m, "restore-memory", func() error {
			return admin.Call(ctx, "sandboxes.create", map[string]any{"from_checkpoint": ck.ID}, &y)
		})
		_, _ = admin.DeleteSandbox(ctx, y.ID)
	}
	_, _ = admin.DeleteSandbox(ctx, x.ID)
}
