package sandboxes

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/quota"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// count is a quota.Counter running q with the top-level tenant as $1 and
// args after it.
func count(q string, args ...any) quota.Counter {
	return func(ctx context.Context, tx *sql.Tx, top string) (int64, error) {
		var n int64
		err := tx.QueryRowContext(ctx, q, append([]any{top}, args...)...).Scan(&n)
		return n, err
	}
}

// admitWarmPools admits a new template whose pool holds mb MiB against
// the tenant's warm_memory_mb quota (the sum over its templates).
func (s *Service) admitWarmPools(ctx context.Context, tx *sql.Tx, tenant string, mb int64) error {
	return s.quotas.Admit(ctx, tx, tenant, quota.WarmMemoryMB, mb, count(sumWarmConfigured))
}

// admitSandbox admits one more sandbox of t: a warm one against the
// memory the tenant's warm sandboxes hold (so a pool never holds more than
// the quota, even one made before the quota was lowered), any other
// against the tenant's live sandboxes.
func (s *Service) admitSandbox(ctx context.Context, tx *sql.Tx, t Template, warm bool) error {
	if warm {
		return s.quotas.Admit(ctx, tx, t.TenantID, quota.WarmMemoryMB, t.Limits.MemoryMB, count(sumWarmHeld, StateStarting, StateWarm))
	}
	return s.quotas.Admit(ctx, tx, t.TenantID, quota.Sandboxes, 1, count(countLive, StateRunning, StateClaiming, StateStarting))
}

// DeleteTemplate deletes a template of tenant and drains its warm pool: its
// unclaimed sandboxes are marked deleted at once (so their host capacity
// and the tenant's warm-pool quota are free for others) and their hosts
// get a signed delete; it waits up to a bound for the hosts' answers.
// Running sandboxes made from the template keep running to their expiry.
func (s *Service) DeleteTemplate(ctx context.Context, actor audit.Entry, tenant, idOrName string) (map[string]any, error) {
	t, err := s.Template(ctx, iam.ScopeOf(tenant), idOrName)
	if err != nil {
		return nil, err
	}
	now := s.clk.Now()
	var drained []Sandbox
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, sqlDeleteTemplate, t.ID, t.TenantID)
		if err != nil {
			return fmt.Errorf("sandboxes: delete template: %w", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return errs.New(errs.NotFound, "template not found")
		}
		if drained, err = drainWarm(ctx, tx, poolOfTemplate, t.ID); err != nil {
			return err
		}
		a := actor
		a.TenantID, a.Action, a.Resource, a.Outcome = t.TenantID, "compute:templates:delete", "template/"+t.ID, "allowed"
		a.Details = map[string]any{"name": t.Name, "drained": len(drained)}
		return audit.Record(ctx, tx, now, a)
	})
	if err != nil {
		return nil, err
	}
	freed := s.deleteManyOnHosts(ctx, actor, drained, 30*time.Second)
	return map[string]any{"id": t.ID, "deleted": true, "drained": len(drained), "freed": freed}, nil
}

// drainWarm marks the unclaimed sandboxes of pool (poolOfTemplate or
// poolOrphans; its one argument is arg) deleted, inside tx, and returns
// them.
func drainWarm(ctx context.Context, tx *sql.Tx, pool string, arg any) ([]Sandbox, error) {
	rows, err := tx.QueryContext(ctx, fmt.Sprintf(sqlWarmPool, pool), arg, StateStarting, StateWarm)
	if err != nil {
		return nil, fmt.Errorf("sandboxes: read warm pool: %w", err)
	}
	var out []Sandbox
	for rows.Next() {
		var x Sandbox
		if err := rows.Scan(&x.ID, &x.NodeID); err != nil {
			rows.Close()
			return nil, fmt.Errorf("sandboxes: read warm pool: %w", err)
		}
		out = append(out, x)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sandboxes: read warm pool: %w", err)
	}
	for _, x := range out {
		if _, err := tx.ExecContext(ctx, sqlDrainWarm, StateDeleted, "template-deleted", x.ID, StateStarting, StateWarm); err != nil {
			return nil, fmt.Errorf("sandboxes: drain warm pool: %w", err)
		}
	}
	return out, nil
}

// drainOrphans drains warm sandboxes whose template no longer exists (a
// refill that raced a template's deletion).
func (s *Service) drainOrphans(ctx context.Context) error {
	var drained []Sandbox
	err := s.db.Tx(ctx, func(tx *sql.Tx) error {
		var err error
		drained, err = drainWarm(ctx, tx, poolOrphans, "")
		return err
	})
	if err != nil {
		return err
	}
	if len(drained) > 0 {
		s.deleteManyOnHosts(ctx, audit.Entry{TenantID: iam.RootTenant, Actor: "sandboxes:warm-pool"}, drained, 0)
	}
	return nil
}

// deleteManyOnHosts sends each sandbox's host a signed delete and waits up
// to within for all their answers (0: does not wait); it reports whether
// every host answered.
func (s *Service) deleteManyOnHosts(ctx context.Context, actor audit.Entry, xs []Sandbox, within time.Duration) bool {
	var ids []string
	ok := true
	for _, x := range xs {
		raw, _ := json.Marshal(spec.Delete{SandboxID: x.ID})
		c, err := s.commands.CreateOwned(ctx, kinds.ModuleSandboxes, system(actor), x.NodeID, kinds.SandboxDelete, raw, 24*time.Hour)
		if err != nil {
			s.log.Error("sandbox delete command", "sandbox_id", x.ID, "err", err)
			ok = false
			continue
		}
		ids = append(ids, c.ID)
	}
	if within <= 0 {
		return false
	}
	deadline := time.Now().Add(within)
	for _, id := range ids {
		if _, err := s.wait(ctx, id, max(time.Until(deadline), time.Millisecond)); err != nil {
			ok = false
		}
	}
	return ok
}
