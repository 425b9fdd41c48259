package server

import (
	"context"
	"time"

	"github.com/bettercompute/bettercompute/internal/commands"
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

// liveCommands answers the secrets broker's reads of live commands from
// the commands table.
type liveCommands struct{ st *commands.Store }

// LiveCommand implements secrets.LiveCommands.
func (l liveCommands) LiveCommand(ctx context.Context, nodeID, commandID string, now time.Time) (secrets.LiveCommand, bool, error) {
	c, ok, err := l.st.LiveCommand(ctx, nodeID, commandID, now)
	return secrets.LiveCommand{Tenant: c.Tenant, Subject: c.Subject, Kind: c.Kind, Payload: c.Payload}, ok, err
}

// tenantSecrets answers the sandboxes module's checks of a template's
// secret references from the secrets module (api role only; nil
// elsewhere).
type tenantSecrets struct{ s *secrets.Service }

// TenantSecretExists implements sandboxes.Secrets.
func (r tenantSecrets) TenantSecretExists(ctx context.Context, tenant, ref string) (bool, error) {
	if r.s == nil {
		return false, errs.New(errs.InvalidConfig, "the secrets module is not running")
	}
	return r.s.TenantSecretExists(ctx, tenant, ref)
}
