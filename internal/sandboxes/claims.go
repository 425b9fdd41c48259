package sandboxes

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/bettercompute/bettercompute/internal/afterreply"
	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// Warm claims answer before the host has applied them. A claim takes a
// warm sandbox in the database, queues the signed sandbox.update that
// gives it the tenant's environment and deadline, and answers at once;
// the host still checks that update (signature, freshness, node, the
// sandbox being warm) before it hands the sandbox over. Until the host's
// answer is confirmed the sandbox's row holds the update's command id:
// every later operation on the sandbox (exec, extend, checkpoint, an
// interactive exec's ticket) first waits for that answer, and a refused,
// failed or expired update fails the sandbox ("claim-refused: <reason>")
// and deletes it on its host: the claim is refused back. The host refuses
// programs in a sandbox still warm (sandbox-not-claimed), so nothing runs
// under the tenant's name before its update applied.

// ReasonClaimRefused prefixes the reason of a sandbox whose host refused
// (or never answered) the update of its warm claim.
const ReasonClaimRefused = "claim-refused"

// claim takes a warm sandbox of t (of its 8 oldest), if one is on a
// connected host, and
// returns it with its signed update queued, without waiting for the host.
// It answers an error only when the tenant's sandboxes quota refuses it.
func (s *Service) claim(ctx context.Context, actor audit.Entry, t Template) (Sandbox, bool, error) {
	xs, err := s.warmOf(ctx, t.ID)
	if err != nil || len(xs) == 0 {
		return Sandbox{}, false, nil
	}
	hosts := make([]string, 0, len(xs))
	for _, x := range xs {
		hosts = append(hosts, x.NodeID)
	}
	connected, err := s.nodes.Connected(ctx, hosts)
	if err != nil {
		return Sandbox{}, false, nil
	}
	if err := s.recheckEnvSecrets(ctx, t); err != nil {
		return Sandbox{}, false, err
	}
	now := s.clk.Now()
	for _, x := range xs {
		if !claimable(x, connected[x.NodeID], t, now) {
			continue
		}
		got, won, err := s.handOver(ctx, actor, t, x, now)
		if err != nil {
			return Sandbox{}, false, err
		}
		if won {
			return got, true, nil
		}
	}
	return Sandbox{}, false, nil
}

// errTaken rolls back a claim whose warm sandbox another create took.
var errTaken = errors.New("sandboxes: taken by another claim")

// handOver takes warm sandbox x for t and queues its signed update in
// one transaction (the quota admission, the sandbox's row, the command
// and both audit rows commit together); won is false when another create
// took x first or its update could not be made (x then stays warm). It
// answers an error only when the tenant's sandboxes quota refuses it.
func (s *Service) handOver(ctx context.Context, actor audit.Entry, t Template, x Sandbox, now time.Time) (Sandbox, bool, error) {
	deadline := now.Add(time.Duration(t.Lifetime) * time.Second)
	maxExp := now.Add(time.Duration(t.MaxLifetime) * time.Second)
	env, err := s.sealEnvFor(t.TenantID, x.ID, t.Env)
	if err != nil {
		return Sandbox{}, false, err
	}
	raw, err := json.Marshal(spec.Update{SandboxID: x.ID, DeadlineMS: deadline.UnixMilli(), Claim: true, Env: env})
	if err != nil {
		return Sandbox{}, false, fmt.Errorf("sandboxes: encode update: %w", err)
	}
	var p *commands.Prepared
	if !needsBroker(env) {
		p, err = s.commands.PrepareOwned(ctx, kinds.ModuleSandboxes, system(actor), x.NodeID, kinds.SandboxUpdate, raw, StartTimeout+time.Minute)
	} else {
		// The update names the tenant's secrets or sealed values: it works
		// for the tenant, whose secrets and env key the host may then fetch
		// for it.
		p, err = s.commands.PrepareFor(ctx, kinds.ModuleSandboxes, system(actor), t.TenantID, x.NodeID, kinds.SandboxUpdate, raw, StartTimeout+time.Minute)
	}
	if err != nil {
		s.log.Warn("warm claim update refused", "sandbox_id", x.ID, "err", err)
		return Sandbox{}, false, nil
	}
	cmd := p.Command().ID
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		if err := s.admitSandbox(ctx, tx, t, false); err != nil {
			return err
		}
		got, err := scanSandbox(tx.QueryRowContext(ctx, sqlClaimed, StateRunning, actor.Actor, now.UnixMilli(), deadline.UnixMilli(),
			maxExp.UnixMilli(), x.ID, StateWarm, cmd))
		if errors.Is(err, sql.ErrNoRows) {
			return errTaken
		}
		if err != nil {
			return fmt.Errorf("sandboxes: claim: %w", err)
		}
		x = got
		if err := p.Write(ctx, tx); err != nil {
			return err
		}
		a := actor
		a.TenantID, a.Action, a.Resource, a.Outcome = t.TenantID, "compute:sandboxes:create", "sandbox/"+x.ID, "allowed"
		a.Details = map[string]any{"template_id": t.ID, "node_id": x.NodeID, "claimed_warm": true, "update_command_id": cmd}
		return audit.Record(ctx, tx, now, a)
	})
	switch {
	case errors.Is(err, errTaken):
		return Sandbox{}, false, nil
	case errs.CodeOf(err) != errs.Internal:
		return Sandbox{}, false, err // a quota's refusal
	case err != nil:
		s.log.Error("record warm claim", "sandbox_id", x.ID, "err", err)
		return Sandbox{}, false, nil
	}
	// The signer is woken once the caller has its answer (afterreply):
	// the update is committed, and the claim answers before its host
	// applies it anyway.
	afterreply.Do(ctx, p.Queued)
	return x, true, nil
}

// warmOf lists what a claim needs of template tpl's 8 oldest warm
// sandboxes: id, host and latest possible expiry.
func (s *Service) warmOf(ctx context.Context, tpl string) ([]Sandbox, error) {
	rows, err := s.db.QueryContext(ctx, sqlWarmOf, tpl, StateWarm)
	if err != nil {
		return nil, fmt.Errorf("sandboxes: warm pool: %w", err)
	}
	defer rows.Close()
	var out []Sandbox
	for rows.Next() {
		var x Sandbox
		var maxExp int64
		if err := rows.Scan(&x.ID, &x.NodeID, &maxExp); err != nil {
			return nil, fmt.Errorf("sandboxes: warm pool: %w", err)
		}
		x.MaxExpires = time.UnixMilli(maxExp).UTC()
		out = append(out, x)
	}
	return out, rows.Err()
}

// GetSettled is Get for an operation that reaches into the sandbox (exec,
// extend, checkpoint, an exec ticket, a preview URL): when the
// sandbox's warm claim is still pending it waits for the host's answer
// first (the claim's update and the operation must reach the host in that
// order), and a refused claim answers INVALID_STATE.
func (s *Service) GetSettled(ctx context.Context, scope iam.Scope, id string) (Sandbox, error) {
	x, err := s.Get(ctx, scope, id)
	if err != nil || x.claimCommand == "" {
		return x, err
	}
	if _, werr := s.wait(ctx, x.claimCommand, StartTimeout); werr != nil {
		var ce *commandError
		if !errors.As(werr, &ce) {
			// Not the host's answer (the wait timed out, the caller left,
			// the database failed): the claim stays pending.
			return Sandbox{}, werr
		}
		s.refuseClaim(context.WithoutCancel(ctx), x, ce.reason)
		return Sandbox{}, errs.New(errs.InvalidState, "the sandbox failed: its host refused the claim")
	}
	s.confirmClaim(ctx, x.ID, x.claimCommand)
	x.claimCommand = ""
	return x, nil
}

// confirmClaim records that the host applied a claim's update.
func (s *Service) confirmClaim(ctx context.Context, id, command string) {
	if _, err := s.db.ExecContext(ctx, sqlClaimConfirmed, id, command); err != nil {
		s.log.Error("confirm warm claim", "sandbox_id", id, "err", err)
	}
}

// refuseClaim fails a sandbox whose claim the host refused (or never
// applied) and has the host delete it; the refusal is an audit row.
func (s *Service) refuseClaim(ctx context.Context, x Sandbox, reason string) {
	now := s.clk.Now()
	refused := false
	err := s.db.Tx(ctx, func(tx *sql.Tx) error {
		refused = false
		res, err := tx.ExecContext(ctx, sqlClaimRefused, StateFailed, ReasonClaimRefused+": "+reason, now.UnixMilli(), x.ID, x.claimCommand, StateRunning)
		if err != nil {
			return fmt.Errorf("sandboxes: refuse claim: %w", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			// Deleted or expired meanwhile (or settled by another
			// process): nothing to refuse, only the pending mark to drop.
			_, err := tx.ExecContext(ctx, sqlClaimConfirmed, x.ID, x.claimCommand)
			return err
		}
		refused = true
		return audit.Record(ctx, tx, now, audit.Entry{TenantID: x.TenantID, Actor: "system:sandboxes", Action: "compute:sandboxes:create",
			Resource: "sandbox/" + x.ID, Outcome: "refused",
			Details: map[string]any{"reason": ReasonClaimRefused, "node_id": x.NodeID, "update_command_id": x.claimCommand, "host_reason": reason}})
	})
	if err != nil {
		s.log.Error("refuse warm claim", "sandbox_id", x.ID, "err", err)
		return
	}
	if !refused {
		return
	}
	s.log.Warn("warm claim refused by host", "sandbox_id", x.ID, "node_id", x.NodeID, "reason", reason)
	s.deleteOnHost(ctx, audit.Entry{TenantID: x.TenantID, Actor: "system:sandboxes"}, x.NodeID, x.ID)
	s.bus.Publish(TopicWarm)
}

// ConfirmClaims settles every pending claim whose update has finished:
// confirmed when it succeeded, refused back otherwise. Run calls it every
// interval (a claim's caller does not wait, and an operation on the
// sandbox settles its own); it returns how many it refused.
func (s *Service) ConfirmClaims(ctx context.Context) (int, error) {
	rows, err := s.db.QueryContext(ctx, sqlPendingClaims)
	if err != nil {
		return 0, fmt.Errorf("sandboxes: pending claims: %w", err)
	}
	var pending []Sandbox
	for rows.Next() {
		var x Sandbox
		if err := rows.Scan(&x.ID, &x.TenantID, &x.NodeID, &x.claimCommand); err != nil {
			rows.Close()
			return 0, fmt.Errorf("sandboxes: pending claims: %w", err)
		}
		pending = append(pending, x)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("sandboxes: pending claims: %w", err)
	}
	refused := 0
	var firstErr error
	for _, x := range pending {
		c, err := s.commands.Get(ctx, iam.RootScope(), x.claimCommand)
		switch {
		case err != nil:
			// One unreadable claim does not hold the others back.
			s.log.Error("read warm claim update", "sandbox_id", x.ID, "err", err)
			if firstErr == nil {
				firstErr = err
			}
		case !commands.Terminal(c.State):
			continue
		case c.State == commands.StateSucceeded:
			s.confirmClaim(ctx, x.ID, x.claimCommand)
		default:
			s.refuseClaim(ctx, x, c.Reason)
			refused++
		}
	}
	return refused, firstErr
}
