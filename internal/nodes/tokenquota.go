package nodes

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/jointoken"
	"github.com/bettercompute/bettercompute/internal/quota"
	"github.com/bettercompute/bettercompute/internal/store"
)

// MaxBulkTokens caps one joinTokens.createMany call.
const MaxBulkTokens = 10000

// TokenChunk is how many tokens one transaction of a bulk creation
// inserts: each transaction is short, so one tenant's bulk call never
// holds the database (SQLite's one writer) away from the others for long.
const TokenChunk = 500

// admitTokens admits want more outstanding join tokens to tenant inside tx,
// of which tx inserts take (the join_tokens quota).
func (s *Service) admitTokens(ctx context.Context, tx *sql.Tx, tenant string, want, take int64, now time.Time) error {
	return s.quotas.AdmitTracked(ctx, tx, tenant, quota.JoinTokens, want, take, func(ctx context.Context, tx *sql.Tx, top string) (int64, error) {
		var n int64
		err := tx.QueryRowContext(ctx, sqlCountOutstandingTokens, top, now.UnixMilli()).Scan(&n)
		return n, err
	})
}

// insertTokens makes count tokens of actor's tenant in transactions of
// TokenChunk tokens. Each transaction admits what is still to be made
// against the quota before it inserts, so parallel calls never take the
// tenant past it; the last one writes the audit row. A refusal or failure
// part-way deletes the tokens made so far (their secrets were never shown)
// and answers the error.
func (s *Service) insertTokens(ctx context.Context, actor audit.Entry, role string, count int, now, exp time.Time) ([]CreatedToken, error) {
	out := make([]CreatedToken, 0, count)
	secrets := make([][]byte, 0, count)
	for range count {
		t := jointoken.Token{Pin: s.cfg.JoinPin, ID: ids.New("jt_"), Secret: ids.Secret(32)}
		out = append(out, CreatedToken{ID: t.ID, Token: t.String(), Role: role, ExpiresAt: exp.UTC()})
		secrets = append(secrets, jointoken.HashSecret(t.Secret))
	}
	done := 0
	for done < count {
		end := min(done+TokenChunk, count)
		err := s.db.Tx(ctx, func(tx *sql.Tx) error {
			if err := s.admitTokens(ctx, tx, actor.TenantID, int64(count-done), int64(end-done), now); err != nil {
				return err
			}
			var q strings.Builder
			q.WriteString(sqlInsertTokensPrefix)
			a := s.db.NewArgs()
			for i := done; i < end; i++ {
				if i > done {
					q.WriteString(", ")
				}
				q.WriteString("(" + a.List(out[i].ID, actor.TenantID, secrets[i], role, "", actor.Actor, now.UnixMilli(), exp.UnixMilli()) + ")")
			}
			if _, err := tx.ExecContext(ctx, q.String(), a.Values()...); err != nil {
				return fmt.Errorf("nodes: insert tokens: %w", err)
			}
			if end < count {
				return nil
			}
			e := actor
			e.Action, e.Resource, e.Outcome = "compute:join-tokens:create", "join-tokens/"+out[0].ID, "allowed"
			e.Details = map[string]any{"role": role, "count": count, "expires_at": exp.UnixMilli()}
			return audit.Record(ctx, tx, now, e)
		})
		if err != nil {
			s.dropTokens(context.WithoutCancel(ctx), out[:done])
			return nil, err
		}
		done = end
	}
	return out, nil
}

// dropTokens deletes tokens a failed bulk call made (never shown to
// anyone); a failure here leaves them to expire unused.
func (s *Service) dropTokens(ctx context.Context, ts []CreatedToken) {
	for chunk := range slices.Chunk(ts, store.InChunk) {
		a := s.db.NewArgs()
		idList := make([]string, len(chunk))
		for i, t := range chunk {
			idList[i] = t.ID
		}
		if _, err := s.db.ExecContext(ctx, sqlDropUnusedTokensPrefix+a.Strings(idList)+`)`, a.Values()...); err != nil {
			s.log.Warn("drop tokens of a failed bulk call", "err", err)
			return
		}
	}
}
