package testenv

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/daemon/sandbox"
	"github.com/bettercompute/bettercompute/internal/sandboxes/checkpoint"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// sandboxImageStore makes the file:// image store the control plane and
// the nodes share.
func sandboxImageStore(t testing.TB, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "objects")
	if err := os.MkdirAll(p, 0o700); err != nil {
		t.Fatalf("image store: %v", err)
	}
	return "file://" + p
}

// nodeDriver returns the node's driver: its sim machine, with a sandbox
// host in front when the environment has a sandbox runtime.
func (e *Env) nodeDriver(t testing.TB, n *Node) driver.Driver {
	t.Helper()
	if e.sandboxRuntime == "" {
		return n.Sim
	}
	ctx := context.Background()
	dir := filepath.Join(n.Dir, "sandbox")
	im, err := sandbox.OpenImages(ctx, e.imageStore, filepath.Join(dir, "images"))
	if err != nil {
		t.Fatalf("sandbox images: %v", err)
	}
	t.Cleanup(func() { im.Close() })
	var rt sandbox.Runtime
	switch e.sandboxRuntime {
	case spec.RuntimeSim:
		rt = sandbox.NewSim()
	default:
		bin, err := exec.LookPath(e.sandboxRuntime)
		if err != nil {
			t.Fatalf("sandbox runtime: %v", err)
		}
		if rt, err = sandbox.NewOCI(e.sandboxRuntime, bin, filepath.Join(dir, "rt")); err != nil {
			t.Fatalf("sandbox runtime: %v", err)
		}
	}
	var eg *sandbox.Egress
	if e.sandboxEgress && e.sandboxRuntime != spec.RuntimeSim {
		if eg, err = sandbox.NewEgress(ctx, sandbox.EgressConfig{Log: e.Log}); err != nil {
			t.Fatalf("sandbox egress: %v", err)
		}
		t.Cleanup(eg.Close)
	}
	ck, err := checkpoint.OpenStore(ctx, e.imageStore)
	if err != nil {
		t.Fatalf("sandbox checkpoints: %v", err)
	}
	t.Cleanup(func() { ck.Close() })
	h, err := sandbox.OpenHost(ctx, sandbox.HostConfig{Dir: dir, Runtime: rt, Images: im, Checkpoints: ck, Clock: e.Clock, Log: e.Log, Slots: 64, MemoryMB: 8192, Egress: eg})
	if err != nil {
		t.Fatalf("sandbox host: %v", err)
	}
	n.Sandbox = h
	t.Cleanup(func() {
		for _, id := range h.Sandboxes() {
			// Delete removes the runtime instance and any egress link.
			raw, _ := json.Marshal(spec.Delete{SandboxID: id})
			_, _ = h.Delete(context.Background(), raw)
		}
	})
	return &sandbox.Driver{Driver: n.Sim, Host: h}
}

// ImageStore is the sandbox image store's URL (empty unless the
// environment has a sandbox runtime): a helper or out-of-process node
// opens the same store.
func (e *Env) ImageStore() string { return e.imageStore }
