package commands

import (
	"context"
	"database/sql"
	"fmt"
	"runtime"

	"golang.org/x/sync/errgroup"

	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// ApplyUpdate records a node's CommandUpdate received on nodeID's session.
// The signed body and signature are stored verbatim; the result is attested
// only when the signature verifies against a certificate of this node that
// is not revoked, not of role node-tenant, and expired less than
// AttestGrace ago. It returns the state recorded.
func (s *Service) ApplyUpdate(ctx context.Context, nodeID string, upd *nodev1.CommandUpdate) (string, error) {
	r := s.ApplyUpdates(ctx, []UpdateItem{{NodeID: nodeID, Update: upd}})
	return r[0].State, r[0].Err
}

// UpdateItem and UpdateResult are the gateway's batch of updates and what
// was recorded for each (defined in package wire, which the gateway can
// import).
type (
	UpdateItem   = wire.UpdateItem
	UpdateResult = wire.UpdateResult
)

// ApplyUpdates records many updates (from many sessions) in one
// transaction, each exactly as ApplyUpdate would: a gateway batches them
// so a fan-out's results do not cost a transaction each. A deadlock, a
// serialization failure or a lost database connection is tried again
// (s.retry, bounded) before the batch is refused; a refused update's
// result carries the error, and the node sends it again.
func (s *Service) ApplyUpdates(ctx context.Context, items []UpdateItem) []UpdateResult {
	out := make([]UpdateResult, len(items))
	var ok []updateTodo
	for i, it := range items {
		body, err := checkUpdate(it.NodeID, it.Update)
		if body != nil {
			out[i].CommandID = body.CommandId
		}
		if err != nil {
			out[i].Err = err
			continue
		}
		ok = append(ok, updateTodo{i: i, body: body})
	}
	if len(ok) == 0 {
		return out
	}
	var changed []string
	err := s.retry.Do(ctx, func() error {
		// Without the certificates nothing can be attested or refused:
		// the whole batch fails unacknowledged.
		if err := s.attestAll(ctx, items, ok); err != nil {
			return err
		}
		var err error
		changed, err = s.writeUpdates(ctx, items, ok, out)
		return err
	})
	if err != nil {
		s.log.Warn("updates not recorded", "count", len(ok), "err", err)
		for _, t := range ok {
			out[t.i].State, out[t.i].Err = "", err
		}
		return out
	}
	for _, id := range changed {
		s.bus.Publish(bus.CommandTopic(id))
	}
	return out
}

// writeUpdates records the checked updates todo in one transaction, one
// statement per round (updateRounds: a round trip per update costs
// PostgreSQL far more than the write), filling out with the state each
// command is in after it. It first locks every named row in id order
// (lockRows), as marking commands sent does, so the two never deadlock
// whatever order the updates arrived in. It returns the ids of the
// commands changed.
func (s *Service) writeUpdates(ctx context.Context, items []UpdateItem, todo []updateTodo, out []UpdateResult) ([]string, error) {
	var changed []string
	now := s.clk.Now()
	ids := make([]string, len(todo))
	for k, t := range todo {
		ids[k] = t.body.CommandId
	}
	err := s.store.tx(ctx, func(tx *sql.Tx) error {
		changed = changed[:0]
		if err := s.store.lockRows(ctx, tx, ids); err != nil {
			return err
		}
		for _, round := range updateRounds(todo, applyPerStmt) {
			applied, err := s.store.applyUpdates(ctx, tx, updateRows(items, round), now)
			if err != nil {
				return err
			}
			for _, t := range round {
				it, body := items[t.i], t.body
				out[t.i].State, out[t.i].Err = "", nil
				if applied[body.CommandId] {
					out[t.i].State = body.State
					changed = append(changed, body.CommandId)
					continue
				}
				// Unknown, another node's, or already final: nothing
				// changes. The node still gets an ack so it stops resending.
				st, found, err := s.store.stateOf(ctx, tx, body.CommandId, it.NodeID)
				if err != nil {
					return err
				}
				if !found {
					out[t.i].Err = errs.New(errs.NotFound, "command not found")
					continue
				}
				out[t.i].State = string(st)
			}
		}
		return nil
	})
	return changed, err
}

// updateRows are the rows one round of updates writes.
func updateRows(items []UpdateItem, round []updateTodo) []updateRow {
	rows := make([]updateRow, len(round))
	for k, t := range round {
		it, body := items[t.i], t.body
		rows[k] = updateRow{commandID: body.CommandId, nodeID: it.NodeID, state: wire.State(body.State), reason: body.Reason, result: body.Result,
			attested: t.attested, body: it.Update.Body, sig: it.Update.NodeSig, serial: it.Update.CertSerial, mayBeLate: mayBeLate(t)}
	}
	return rows
}

// mayBeLate is 1 when t may be recorded on a command already cancelled as
// expired: an attested result, succeeded or failed (what the node proves
// it did). A running update or a node's own refusal never revives one.
func mayBeLate(t updateTodo) int {
	st := wire.State(t.body.State)
	if t.attested == 1 && (st == wire.StateSucceeded || st == wire.StateFailed) {
		return 1
	}
	return 0
}

// attestAll checks the node signatures of the updates in todo and sets
// each one's attested flag: one certificate query and one command query
// for the whole batch, and the signature checks spread over the CPUs,
// since a fan-out's results arrive together. It fails only when the
// certificates or commands cannot be read.
func (s *Service) attestAll(ctx context.Context, items []UpdateItem, todo []updateTodo) error {
	if len(todo) == 0 {
		return nil
	}
	for k := range todo {
		todo[k].attested = 0
	}
	seen := map[string]bool{}
	var serials []string
	cmdIDs := make([]string, 0, len(todo))
	for _, t := range todo {
		if sn := items[t.i].Update.GetCertSerial(); !seen[sn] {
			seen[sn] = true
			serials = append(serials, sn)
		}
		cmdIDs = append(cmdIDs, t.body.CommandId)
	}
	states, err := s.nodes.CertStates(ctx, serials)
	if err != nil {
		return fmt.Errorf("commands: read update certificates: %w", err)
	}
	rows, err := s.store.bindings(ctx, cmdIDs)
	if err != nil {
		return err
	}
	now := s.clk.Now()
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for k := range todo {
		g.Go(func() error {
			it := items[todo[k].i]
			attested, why := attest(states, rows, now, it.NodeID, it.Update, todo[k].body)
			if !attested {
				s.log.Warn("update not attested", "node_id", it.NodeID, "command_id", todo[k].body.CommandId, "why", why)
				return nil
			}
			todo[k].attested = 1
			return nil
		})
	}
	return g.Wait()
}
