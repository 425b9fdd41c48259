package secrets

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// SecretExists reports whether ref names a live secret of scopeTenant: the
// reference must parse and name scopeTenant itself, so another tenant's
// secret (and, for a non-root scope, every fleet secret) answers false
// exactly as a missing one does. The same query runs in every case, so the
// answer's timing does not tell them apart either. The commands module
// calls it when a command is created.
func (s *Service) SecretExists(ctx context.Context, scopeTenant, ref string) (bool, error) {
	tenant, _, ok := ParseRef(ref)
	if !ok || tenant != scopeTenant {
		// Still ask the database, under the scope tenant, so a refusal
		// costs what a lookup of a missing secret costs.
		ref = ""
	}
	var one int
	err := s.db.QueryRowContext(ctx, sqlExists, ref, scopeTenant).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("secrets: look up reference: %w", err)
	}
	return ok && tenant == scopeTenant, nil
}

// TenantSecretExists reports whether ref names a live secret that tenant
// put itself (scope tenant): another tenant's secret and every fleet
// secret answer false exactly as a missing one does, with the same query.
// The sandboxes module calls it for a template's secret environment.
func (s *Service) TenantSecretExists(ctx context.Context, tenant, ref string) (bool, error) {
	refTenant, _, ok := ParseRef(ref)
	if !ok || refTenant != tenant {
		ref = ""
	}
	var one int
	err := s.db.QueryRowContext(ctx, sqlTenantScoped, ref, tenant).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("secrets: look up reference: %w", err)
	}
	return ok && refTenant == tenant, nil
}
