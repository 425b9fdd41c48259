package testenv

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
	rts := sandboxRuntimes(t, e.sandboxRuntime, dir)
	var eg *sandbox.Egress
	if e.sandboxEgress && !strings.Contains(e.sandboxRuntime, spec.RuntimeSim) {
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
	h, err := sandbox.OpenHost(ctx, sandbox.HostConfig{Dir: dir, Runtimes: rts, Images: im, Checkpoints: ck, Clock: e.Clock, Log: e.Log, Slots: 64, MemoryMB: 8192, Egress: eg})
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

// sandboxRuntimes makes the runtimes list names (comma-separated) for
// the host in dir, each OCI runtime in its own directory as bcd's.
func sandboxRuntimes(t testing.TB, list, dir string) []sandbox.Runtime {
	t.Helper()
	names := strings.Split(list, ",")
	var rts []sandbox.Runtime
	for _, name := range names {
		if name == spec.RuntimeSim {
			rts = append(rts, sandbox.NewSim())
			continue
		}
		bin, err := exec.LookPath(name)
		if err != nil {
			t.Fatalf("sandbox runtime: %v", err)
		}
		rt, err := sandbox.NewOCI(name, bin, sandbox.RuntimeDir(dir, name, names))
		if err != nil {
			t.Fatalf("sandbox runtime: %v", err)
		}
		rts = append(rts, rt)
	}
	return rts
}

// ImageStore is the sandbox image store's URL (empty unless the
// environment has a sandbox runtime): a helper or out-of-process node
// opens the same store.
func (e *Env) ImageStore() string { return e.imageStore }
