package server

import (
	"context"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/secrets"
)

// secretRefs answers the commands module's secret-reference checks from
// the secrets module, which a process has only with the api role (the one
// place commands are created from callers' payloads); s is nil elsewhere.
type secretRefs struct{ s *secrets.Service }

// SecretExists implements commands.SecretChecker.
func (r secretRefs) SecretExists(ctx context.Context, scopeTenant, ref string) (bool, error) {
	if r.s == nil {
		return false, errs.New(errs.InvalidConfig, "the secrets module is not running")
	}
	return r.s.SecretExists(ctx, scopeTenant, ref)
}
