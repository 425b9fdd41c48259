package iam

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/errs"
)

// The statements of a role's deletion.
const (
	qDeleteBindingsOfRole = `DELETE FROM bindings WHERE role_id = $1`
	qDeleteRole           = `DELETE FROM roles WHERE id = $1 AND tenant_id = $2`
)

// BuiltinRole reports whether id is one of the built-in roles (admin,
// operator, viewer), which cannot be deleted.
func BuiltinRole(id string) bool { return id == "admin" || id == "operator" || id == "viewer" }

// DeleteRole deletes a role defined in tenant and every binding of it (in
// tenant and below), with its audit row, in one transaction: who held the
// role alone loses its actions at once. A built-in role is refused
// (INVALID_STATE); a role of another tenant answers NOT_FOUND as a missing
// one. It returns how many bindings went with it.
func (s *Service) DeleteRole(ctx context.Context, actor audit.Entry, tenant, id string) (int64, error) {
	if BuiltinRole(id) {
		return 0, errs.New(errs.InvalidState, "a built-in role cannot be deleted")
	}
	now := s.clk.Now()
	var unbound int64
	err := s.db.Tx(ctx, func(tx *sql.Tx) error {
		var owner string
		err := tx.QueryRowContext(ctx, qRoleTenant, id).Scan(&owner)
		if errors.Is(err, sql.ErrNoRows) || (err == nil && owner != tenant) {
			return errs.New(errs.NotFound, "role not found")
		}
		if err != nil {
			return fmt.Errorf("iam: read role: %w", err)
		}
		res, err := tx.ExecContext(ctx, qDeleteBindingsOfRole, id)
		if err != nil {
			return fmt.Errorf("iam: delete role bindings: %w", err)
		}
		unbound, _ = res.RowsAffected()
		if _, err := tx.ExecContext(ctx, qDeleteRole, id, tenant); err != nil {
			return fmt.Errorf("iam: delete role: %w", err)
		}
		actor.TenantID, actor.Action, actor.Resource, actor.Outcome = tenant, "compute:roles:delete", "role/"+id, "allowed"
		actor.Details = map[string]any{"bindings_deleted": unbound}
		return audit.Record(ctx, tx, now, actor)
	})
	if err == nil {
		s.accessChanged()
	}
	return unbound, err
}
