package commands

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
)

// sqlCancelQueued cancels ($1 state, $2 reason, $3 at) a command ($4)
// still in state $5 (queued).
const sqlCancelQueued = `UPDATE commands SET state = $1, reason = $2, updated_at = $3 WHERE id = $4 AND state = $5`

// ReasonOperatorCancelled is the reason of a command an operator cancelled.
const ReasonOperatorCancelled = "cancelled-by-operator"

// ReasonExpired is the reason of a command the sweep cancelled because it
// expired before a node reported it running. Only such a command later
// takes a result a node proves it made (attested), marked late.
const ReasonExpired = "expired"

// Cancel cancels a queued command visible in scope, with its audit row in
// the command's tenant, before any node has it: it is never delivered. A
// command already sent or running answers INVALID_STATE (its node may be
// running it; revoke the node to stop it), a finished one too, and a
// command outside scope NOT_FOUND as a missing one.
func (s *Service) Cancel(ctx context.Context, actor audit.Entry, scope iam.Scope, id string) (Command, error) {
	c, err := s.Get(ctx, scope, id)
	if err != nil {
		return Command{}, err
	}
	now := s.clk.Now()
	err = s.store.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, sqlCancelQueued, string(wire.StateCancelled), ReasonOperatorCancelled, now.UnixMilli(), id, string(wire.StateQueued))
		if err != nil {
			return fmt.Errorf("commands: cancel: %w", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return errs.New(errs.InvalidState, "only a queued command can be cancelled; this one is "+string(c.State)+" (revoke its node to stop a command it already has)")
		}
		actor.TenantID, actor.Action, actor.Resource, actor.Outcome = c.TenantID, "compute:commands:cancel", "command/"+id, "allowed"
		actor.Details = map[string]any{"node_id": c.NodeID, "kind": c.Kind}
		return audit.Record(ctx, tx, now, actor)
	})
	if err != nil {
		return Command{}, err
	}
	s.bus.Publish(bus.CommandTopic(id))
	c.State, c.Reason = wire.StateCancelled, ReasonOperatorCancelled
	return c, nil
}
