package sandbox

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/sandboxes/checkpoint"
	"github.com/bettercompute/bettercompute/internal/sandboxes/imagetar"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// sharedBucket is a folder object store (images and checkpoints) that
// several hosts of a test open, with the busybox image in it; it answers
// the folder and the image's digest.
func sharedBucket(t *testing.T) (string, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "bcbk-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	tarball, err := imagetar.Busybox()
	if err != nil {
		t.Skip(err)
	}
	digest := imagetar.Digest(tarball)
	im, err := OpenImages(context.Background(), "file://"+dir, filepath.Join(dir, "cache"))
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	if err := im.bucket.WriteAll(context.Background(), ImageKey(digest), tarball, nil); err != nil {
		t.Fatal(err)
	}
	return dir, digest
}

// ckptHost opens a host with its own state directory on runtime rt over
// the shared bucket, with a checkpoint store on it (as Open does).
func ckptHost(t *testing.T, rt func(dir string) Runtime, bucket string) *Host {
	t.Helper()
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "bcck-") // short: overlay options hold paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	im, err := OpenImages(ctx, "file://"+bucket, filepath.Join(dir, "images"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { im.Close() })
	cs, err := checkpoint.OpenStore(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	h, err := OpenHost(ctx, HostConfig{Dir: dir, Runtime: rt(filepath.Join(dir, "rt")), Images: im, Clock: clock.Real{},
		Log: slog.New(slog.NewTextHandler(testLogOut(io.Discard), nil)), Slots: 8, MemoryMB: 4096, Checkpoints: cs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, id := range h.Sandboxes() {
			_ = h.remove(context.Background(), id)
		}
	})
	return h
}

func simRuntime(string) Runtime { return NewSim() }

// checkpointOf runs sandbox.checkpoint through the host's Driver and
// answers the result or the refusal.
func checkpointOf(h *Host, id string, memory bool) (spec.CheckpointResult, error) {
	raw, _ := json.Marshal(spec.Checkpoint{SandboxID: id, Memory: memory})
	var r spec.CheckpointResult
	out, err := (&Driver{Host: h}).Run(context.Background(), kinds.SandboxCheckpoint, raw)
	if err == nil {
		err = json.Unmarshal(out, &r)
	}
	if err == nil {
		err = r.Validate()
	}
	return r, err
}

// createErr runs sandbox.create and answers its refusal (nil on success).
func createErr(h *Host, c spec.Create) error {
	raw, _ := json.Marshal(c)
	_, err := h.Create(context.Background(), raw)
	return err
}

// tamper flips one byte of the stored checkpoint object of digest.
func tamper(t *testing.T, bucket, digest string) {
	t.Helper()
	p := filepath.Join(bucket, "checkpoints", "sha256", strings.TrimPrefix(digest, "sha256:"))
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x40
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// assertRefusal fails unless err is exactly the refusal want.
func assertRefusal(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil || err.Error() != want {
		t.Fatalf("refusal %v, want %s", err, want)
	}
}

// assertNoSandbox fails unless the host holds no sandbox id: no state, no
// runtime instance, no layer.
func assertNoSandbox(t *testing.T, h *Host, id string) {
	t.Helper()
	if got := h.Sandboxes(); len(got) != 0 {
		t.Fatalf("sandboxes left: %v", got)
	}
	if _, err := os.Stat(h.statePath(id)); !os.IsNotExist(err) {
		t.Fatalf("state left: %v", err)
	}
	if h.cfg.Runtime.Running(context.Background(), id) {
		t.Fatal("runtime instance left")
	}
	if o, ok := h.cfg.Runtime.(*OCI); ok {
		if _, err := os.Stat(o.bundle(id)); !os.IsNotExist(err) {
			t.Fatalf("bundle left: %v", err)
		}
	}
	if s, ok := h.cfg.Runtime.(*Sim); ok {
		if _, err := os.Stat(s.layer(id)); !os.IsNotExist(err) {
			t.Fatalf("layer left: %v", err)
		}
	}
}

// TestSimCheckpointRestore: the sim runtime goes through the same host
// code, store and Materialize: a checkpoint of a sim sandbox restores on
// a second host (state records it), a tampered object fails the create
// with checkpoint-digest-mismatch and leaves nothing, a memory
// checkpoint is refused, an unknown sandbox is not found.
func TestSimCheckpointRestore(t *testing.T) {
	bucket, digest := sharedBucket(t)
	a, b := ckptHost(t, simRuntime, bucket), ckptHost(t, simRuntime, bucket)
	c := createSpec(digest, time.Now().Add(time.Hour), 64)
	c.Runtime = spec.RuntimeSim
	mustCreate(t, a, c)
	dir, err := a.cfg.Runtime.(Layers).LayerDir(c.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "note"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := checkpointOf(a, c.SandboxID, false)
	if err != nil {
		t.Fatal(err)
	}
	_, err = checkpointOf(a, c.SandboxID, true)
	assertRefusal(t, err, spec.ReasonMemoryNeedsRunsc)
	_, err = checkpointOf(a, ids.New("sbx"), false)
	assertRefusal(t, err, "sandbox-not-found")

	r := createSpec(digest, time.Now().Add(time.Hour), 64)
	r.Runtime, r.FromCheckpoint = spec.RuntimeSim, res.Digest
	mustCreate(t, b, r)
	if st, _ := b.Get(r.SandboxID); st.FromCheckpoint != res.Digest {
		t.Fatalf("state from_checkpoint %q, want %s", st.FromCheckpoint, res.Digest)
	}
	got, err := os.ReadFile(filepath.Join(b.cfg.Runtime.(*Sim).layer(r.SandboxID), "note"))
	if err != nil || string(got) != "kept" {
		t.Fatalf("restored note %q %v", got, err)
	}
	mustDelete(t, b, r.SandboxID)

	tamper(t, bucket, res.Digest)
	bad := createSpec(digest, time.Now().Add(time.Hour), 64)
	bad.Runtime, bad.FromCheckpoint = spec.RuntimeSim, res.Digest
	assertRefusal(t, createErr(b, bad), checkpoint.ReasonDigestMismatch)
	assertNoSandbox(t, b, bad.SandboxID)
	missing := bad
	missing.FromCheckpoint = "sha256:" + strings.Repeat("0", 64)
	assertRefusal(t, createErr(b, missing), "checkpoint-not-found")
	assertNoSandbox(t, b, bad.SandboxID)
}

func mustDelete(t *testing.T, h *Host, id string) {
	t.Helper()
	raw, _ := json.Marshal(spec.Delete{SandboxID: id})
	if _, err := h.Delete(context.Background(), raw); err != nil {
		t.Fatal(err)
	}
}

// TestRuncCheckpointRestore: on real runc, what a root sandbox wrote
// survives a checkpoint and a restore on a second host (another state
// directory, the same bucket); an image file it deleted (a whiteout) and
// a directory it replaced (opaque) stay so; the restored sandbox's user,
// non-root, can write in the restored tree; the first sandbox keeps
// running; a tampered object fails the create with
// checkpoint-digest-mismatch and leaves no sandbox; memory on runc is
// refused memory-checkpoint-needs-runsc.
func TestRuncCheckpointRestore(t *testing.T) {
	rt := runcRuntime(t)
	bucket, digest := sharedBucket(t)
	a, b := ckptHost(t, rt, bucket), ckptHost(t, rt, bucket)
	c := createSpec(digest, time.Now().Add(time.Hour), 64)
	c.Root = true
	mustCreate(t, a, c)
	script := "mkdir /tmp/d && echo hello > /tmp/d/f && rm /bin/vi && rm -rf /etc && mkdir /etc && echo new > /etc/only"
	if r := execIn(t, a, c.SandboxID, 30*time.Second, "sh", "-c", script); r.ExitCode != 0 {
		t.Fatalf("write: %+v", r)
	}
	_, err := checkpointOf(a, c.SandboxID, true)
	assertRefusal(t, err, spec.ReasonMemoryNeedsRunsc)
	res, err := checkpointOf(a, c.SandboxID, false)
	if err != nil {
		t.Fatal(err)
	}
	if r := execIn(t, a, c.SandboxID, 30*time.Second, "cat", "/tmp/d/f"); string(r.Stdout) != "hello\n" {
		t.Fatalf("the checkpointed sandbox does not run on: %+v", r)
	}

	r := createSpec(digest, time.Now().Add(time.Hour), 64)
	r.FromCheckpoint = res.Digest
	mustCreate(t, b, r)
	check := "cat /tmp/d/f && echo more >> /tmp/d/f && touch /tmp/d/g && ls /etc && test ! -e /bin/vi && test ! -e /etc/passwd && id -u"
	out := execIn(t, b, r.SandboxID, 30*time.Second, "sh", "-c", check)
	if out.ExitCode != 0 || string(out.Stdout) != "hello\nonly\n65534\n" {
		t.Fatalf("restored sandbox: %+v (stderr %s)", out, out.Stderr)
	}

	tamper(t, bucket, res.Digest)
	bad := createSpec(digest, time.Now().Add(time.Hour), 64)
	bad.FromCheckpoint = res.Digest
	assertRefusal(t, createErr(b, bad), checkpoint.ReasonDigestMismatch)
	if got := b.Sandboxes(); len(got) != 1 || got[0] != r.SandboxID {
		t.Fatalf("sandboxes after a refused restore: %v", got)
	}
	mustDelete(t, b, r.SandboxID)
	assertNoSandbox(t, b, bad.SandboxID)
}

// counterOf reads /counter in sandbox id (-1 when unreadable).
func counterOf(t *testing.T, h *Host, id string) int {
	t.Helper()
	r := execIn(t, h, id, 30*time.Second, "cat", "/counter")
	n, err := strconv.Atoi(strings.TrimSpace(string(r.Stdout)))
	if err != nil {
		return -1
	}
	return n
}

// waitCounter polls sandbox id's /counter until it is over min, or
// fails at the deadline; it answers the value seen.
func waitCounter(t *testing.T, h *Host, id string, min int) int {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if n := counterOf(t, h, id); n > min {
			return n
		}
	}
	t.Fatalf("/counter in %s never went over %d", id, min)
	return 0
}

// TestRunscMemoryCheckpointRestore: on gVisor, a process counting in a
// shell variable (its only copy of the count is in memory) survives a
// memory checkpoint and a restore on a second host: the restored
// sandbox's counter goes on from past the checkpointed value instead of
// starting again, and the checkpointed sandbox keeps running; a layer
// checkpoint (pause, pack, resume) works on runsc too.
func TestRunscMemoryCheckpointRestore(t *testing.T) {
	rt := runscRuntime(t)
	bucket, digest := sharedBucket(t)
	a, b := ckptHost(t, rt, bucket), ckptHost(t, rt, bucket)
	// gVisor's ptrace platform's own processes count under the pids
	// limit: room for them and the loop.
	c := createSpec(digest, time.Now().Add(time.Hour), 1024)
	c.Runtime, c.Root = spec.RuntimeRunsc, true
	mustCreate(t, a, c)
	loop := "i=0; while true; do i=$((i+1)); echo $i > /counter.new && mv /counter.new /counter; usleep 50000; done"
	if r := execIn(t, a, c.SandboxID, 30*time.Second, "sh", "-c", "sh -c '"+loop+"' </dev/null >/dev/null 2>&1 &"); r.ExitCode != 0 {
		t.Fatalf("start counter: %+v", r)
	}
	seen := waitCounter(t, a, c.SandboxID, 3)
	if _, err := checkpointOf(a, c.SandboxID, false); err != nil {
		t.Fatalf("layer checkpoint (runsc pause, resume): %v", err)
	}
	res, err := checkpointOf(a, c.SandboxID, true)
	if err != nil {
		t.Fatal(err)
	}
	if res.MemoryDigest == "" || res.MemorySize <= 0 {
		t.Fatalf("no memory checkpoint: %+v", res)
	}
	waitCounter(t, a, c.SandboxID, seen+1)

	r := createSpec(digest, time.Now().Add(time.Hour), 1024)
	r.Runtime, r.Root, r.FromCheckpoint, r.FromMemory = spec.RuntimeRunsc, true, res.Digest, res.MemoryDigest
	if err := createErr(b, r); err != nil {
		t.Fatalf("restore: %v", err)
	}
	first := waitCounter(t, b, r.SandboxID, seen)
	waitCounter(t, b, r.SandboxID, first)
}
