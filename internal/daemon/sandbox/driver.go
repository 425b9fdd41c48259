package sandbox

import (
	"context"

	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/kinds"
)

// Driver adds the sandbox kinds to another driver: sandbox.* runs on the
// host, every other kind on the wrapped driver.
type Driver struct {
	driver.Driver
	Host *Host
}

// Run routes a verified command to the sandbox host or the inner driver.
func (d *Driver) Run(ctx context.Context, kind string, payload []byte) ([]byte, error) {
	switch kind {
	case kinds.SandboxCreate:
		return d.Host.Create(ctx, payload)
	case kinds.SandboxExec:
		return d.Host.Exec(ctx, payload)
	case kinds.SandboxUpdate:
		return d.Host.Update(ctx, payload)
	case kinds.SandboxDelete:
		return d.Host.Delete(ctx, payload)
	case kinds.SandboxCheckpoint:
		return d.Host.Checkpoint(ctx, payload)
	}
	return d.Driver.Run(ctx, kind, payload)
}

// Labels are the host's runtime capability labels (see Host.Labels).
func (d *Driver) Labels() map[string]string { return d.Host.Labels() }

// OnSandboxFailed sets f to be told of each sandbox the host found dead
// and removed (see Host.OnFailed); the daemon reports them on its session.
func (d *Driver) OnSandboxFailed(f func(sandboxID, reason string)) { d.Host.OnFailed(f) }

// OpenShell starts an interactive exec in a sandbox on this host (see
// Host.OpenShell).
func (d *Driver) OpenShell(ctx context.Context, sandboxID string, argv []string) (driver.Shell, error) {
	return d.Host.OpenShell(ctx, sandboxID, argv)
}

// AdoptSandboxes checks the sandboxes the host found running at open
// against the signed commands they were made from, verified again with
// check, kills those that do not match, and returns the ids it adopted
// (see Host.Adopt). The daemon calls it once it can verify, and reports
// the adopted ones to the control plane.
func (d *Driver) AdoptSandboxes(ctx context.Context, check func(signed []byte, kind string) ([]byte, error)) ([]string, error) {
	return d.Host.Adopt(ctx, check), nil
}
