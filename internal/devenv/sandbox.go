package devenv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/daemon/sandbox"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
	"github.com/bettercompute/bettercompute/internal/sandboxes/imagetar"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
	"github.com/bettercompute/bettercompute/internal/server"
)

// imageStore makes DATA/objects, dev's image store, and returns its URL.
func imageStore(dataDir string) (string, error) {
	p := filepath.Join(dataDir, "objects")
	if err := os.MkdirAll(p, 0o700); err != nil {
		return "", fmt.Errorf("image store: %w", err)
	}
	return "file://" + p, nil
}

// devRuntime is runc when it can run here (installed, root), else sim.
func devRuntime() string {
	if _, ok := sandbox.Usable(spec.RuntimeRunc); ok {
		return spec.RuntimeRunc
	}
	return spec.RuntimeSim
}

// sandboxDriver puts a sandbox host on runtime in front of a node's sim
// driver and keeps its deadline sweep running until ctx ends.
func sandboxDriver(ctx context.Context, inner driver.Driver, nodeDir, store, runtime string, clk clock.Clock, log *slog.Logger) (driver.Driver, func(), error) {
	h, closeImages, err := sandbox.Open(ctx, sandbox.Options{DataDir: nodeDir, Runtime: runtime, ImageStore: store, Slots: 32, MemoryMB: 4096, Clock: clk, Log: log})
	if err != nil {
		return nil, nil, err
	}
	go h.Run(ctx, time.Second)
	return &sandbox.Driver{Driver: inner, Host: h}, closeImages, nil
}

// seedSandboxes imports the default busybox image and a "default"
// template into the root tenant, once, and says what to run.
func seedSandboxes(ctx context.Context, cp *server.ControlPlane, runtime string) string {
	actor := devActor
	if _, err := cp.Sandboxes.Template(ctx, iam.RootScope(), "default"); err == nil {
		return sandboxHint(runtime)
	}
	tarball, err := imagetar.Busybox()
	if err != nil {
		return "Sandboxes: " + err.Error() + ", then:\n  better-compute templates create default --image NAME --runtime " + runtime + "\n"
	}
	if _, err := cp.Sandboxes.ImportBytes(ctx, actor, iam.RootTenant, "busybox", tarball); err != nil {
		return "Sandboxes: importing the default image failed: " + err.Error() + "\n"
	}
	_, err = cp.Sandboxes.CreateTemplate(ctx, actor, iam.RootTenant, sandboxes.TemplateIn{Name: "default", Image: "busybox", Runtime: runtime,
		Limits: spec.Limits{CPUMillis: 1000, MemoryMB: 256, Pids: 128, DiskMB: 128}})
	if err != nil && !errors.Is(err, context.Canceled) {
		return "Sandboxes: the default template failed: " + err.Error() + "\n"
	}
	return sandboxHint(runtime)
}

func sandboxHint(runtime string) string {
	return "Sandboxes on " + runtime + " (image busybox, template default):\n" +
		"  ID=$(better-compute sandbox create --template default)\n" +
		"  better-compute sandbox exec $ID -- echo hello\n"
}

// previewHint says where the preview role listens and, on runc (the
// runtime previews reach), how to get a preview URL.
func previewHint(runtime, addr string) string {
	if addr == "" {
		return ""
	}
	if runtime != spec.RuntimeRunc {
		return "Previews are served at https://" + addr + " (runc sandboxes only; this host runs " + runtime + ")\n"
	}
	return "Previews (served at https://" + addr + "; the URL is a credential):\n" +
		"  better-compute sandbox exec $ID -- sh -c 'mkdir -p /tmp/www && echo hi > /tmp/www/index.html && busybox httpd -p 127.0.0.1:8080 -h /tmp/www'\n" +
		"  curl --cacert $BC_CA_FILE $(better-compute sandbox preview $ID --port 8080)\n"
}
