package server

import (
	"context"

	"github.com/bettercompute/bettercompute/internal/errs"
)

// secretRefs answers the commands module's secret-reference checks from
// the secrets module, which the control plane makes after the commands
// module (and only in a process that serves the API, the one place
// commands are created from callers' payloads).
type secretRefs struct{ cp *ControlPlane }

// SecretExists implements commands.SecretChecker.
func (s secretRefs) SecretExists(ctx context.Context, scopeTenant, ref string) (bool, error) {
	if s.cp.Secrets == nil {
		return false, errs.New(errs.InvalidConfig, "the secrets module is not running")
	}
	return s.cp.Secrets.SecretExists(ctx, scopeTenant, ref)
}
