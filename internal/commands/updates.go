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
// so a fan-out's results do not cost a transaction each.
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
	// Without the certificates nothing can be attested or refused: the
	// whole batch fails unacknowledged and the nodes send it again.
	if err := s.attestAll(ctx, items, ok); err != nil {
		for _, t := range ok {
			out[t.i].Err = err
		}
		return out
	}
	if len(ok) == 0 {
		return out
	}
	changed, err := s.writeUpdates(ctx, items, ok, out)
	if err != nil {
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
// command is in after it. It returns the ids of the commands changed.
func (s *Service) writeUpdates(ctx context.Context, items []UpdateItem, todo []updateTodo, out []UpdateResult) ([]string, error) {
	var changed []string
	now := s.clk.Now()
	err := s.store.tx(ctx, func(tx *sql.Tx) error {
		changed = changed[:0]
		for _, round := range updateRounds(todo, applyPerStmt) {
			applied, err := s.store.applyUpdates(ctx, tx, updateRows(items, round), now)
			if err != nil {
				return err
			}
			for _, t := range round {
				it, body := items[t.i], t.body
				if applied[body.CommandId] {
					out[t.i].State = body.State
					changed = append(changed, body.CommandId)
					continue
				}
				// Unknown, another node's, or already final: nothing
				// changes. The node still gets an ack so it stops resending.
				st, found := s.store.stateOf(ctx, tx, body.CommandId, it.NodeID)
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
			attested: t.attested, body: it.Update.Body, sig: it.Update.NodeSig, serial: it.Update.CertSerial}
	}
	return rows
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
