package sandboxes

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
)

// The statements of a tenant's teardown.
const (
	sqlTenantTemplates  = `SELECT id FROM sandbox_templates WHERE tenant_id = $1`
	sqlDeleteTemplates  = `DELETE FROM sandbox_templates WHERE tenant_id = $1`
	sqlTenantLive       = `SELECT id, node_id FROM sandboxes WHERE tenant_id = $1 AND state IN ($2, $3, $4, $5)`
	sqlMarkTenantDelete = `UPDATE sandboxes SET state = $1, reason = $2, updated_at = $3 WHERE tenant_id = $4 AND state IN ($5, $6, $7, $8)`
)

// ReasonTenantDeleted is the reason of a sandbox deleted with its tenant.
const ReasonTenantDeleted = "tenant-deleted"

// Teardown deletes everything a deleted tenant holds in the module: its
// templates go (so nothing refills their warm pools), and every live
// sandbox of the tenant, warm or claimed, is marked deleted at once (its
// host capacity and the quota are free) with one audit row in tenant, in
// one transaction; the hosts then get a signed delete each, waited for up
// to a bound. It returns how many templates and sandboxes it deleted.
func (s *Service) Teardown(ctx context.Context, actor audit.Entry, tenant string) (templates, sandboxes int, err error) {
	now := s.clk.Now()
	var live []Sandbox
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		tpls, err := firstColumn(ctx, tx, sqlTenantTemplates, tenant)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, sqlDeleteTemplates, tenant); err != nil {
			return fmt.Errorf("sandboxes: delete tenant templates: %w", err)
		}
		if live, err = liveOf(ctx, tx, tenant); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, sqlMarkTenantDelete, StateDeleted, ReasonTenantDeleted, now.UnixMilli(), tenant,
			StateStarting, StateWarm, StateClaiming, StateRunning); err != nil {
			return fmt.Errorf("sandboxes: delete tenant sandboxes: %w", err)
		}
		templates = len(tpls)
		a := actor
		a.TenantID, a.Action, a.Resource, a.Outcome = tenant, "compute:tenants:delete", "tenant/"+tenant, "allowed"
		a.Details = map[string]any{"step": "sandboxes", "templates_deleted": templates, "sandboxes_deleted": len(live)}
		return audit.Record(ctx, tx, now, a)
	})
	if err != nil {
		return 0, 0, err
	}
	s.deleteManyOnHosts(ctx, actor, live, 30*time.Second)
	return templates, len(live), nil
}

// firstColumn runs q (one argument) inside tx and returns the first column.
func firstColumn(ctx context.Context, tx *sql.Tx, q string, arg any) ([]string, error) {
	rows, err := tx.QueryContext(ctx, q, arg)
	if err != nil {
		return nil, fmt.Errorf("sandboxes: read ids: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("sandboxes: read ids: %w", err)
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

// liveOf returns the live sandboxes of tenant (id and host), inside tx.
func liveOf(ctx context.Context, tx *sql.Tx, tenant string) ([]Sandbox, error) {
	rows, err := tx.QueryContext(ctx, sqlTenantLive, tenant, StateStarting, StateWarm, StateClaiming, StateRunning)
	if err != nil {
		return nil, fmt.Errorf("sandboxes: read tenant sandboxes: %w", err)
	}
	defer rows.Close()
	var out []Sandbox
	for rows.Next() {
		var x Sandbox
		if err := rows.Scan(&x.ID, &x.NodeID); err != nil {
			return nil, fmt.Errorf("sandboxes: read tenant sandboxes: %w", err)
		}
		out = append(out, x)
	}
	return out, rows.Err()
}
