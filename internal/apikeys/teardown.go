package apikeys

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/revocations"
	"github.com/bettercompute/bettercompute/internal/revocations/revwire"
)

// The statements of a tenant's teardown: every unrevoked key and session
// of one tenant.
const (
	qKeysOfTenant           = `SELECT id, tenant_id FROM api_keys WHERE tenant_id = $1 AND revoked_at IS NULL`
	qSessionsOfTenant       = `SELECT id, tenant_id FROM sessions WHERE tenant_id = $1 AND revoked_at IS NULL`
	qRevokeKeysOfTenant     = `UPDATE api_keys SET revoked_at = $1 WHERE tenant_id = $2 AND revoked_at IS NULL`
	qRevokeSessionsOfTenant = `UPDATE sessions SET revoked_at = $1 WHERE tenant_id = $2 AND revoked_at IS NULL`
)

// RevokeTenant revokes every key and session of tenant and everything they
// made (RevokeMadeBy, keys made in other tenants included), with one audit
// row in tenant, in one transaction: a deleted tenant's credentials never
// authenticate again, whatever becomes of the tenant's state. It returns
// how many keys and sessions it revoked.
func (s *Service) RevokeTenant(ctx context.Context, actor audit.Entry, tenant string) (keys, sessions int64, err error) {
	now := s.clk.Now()
	at := now.UnixMilli()
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		var own [2][]cred
		for i, q := range []string{qKeysOfTenant, qSessionsOfTenant} {
			rows, err := tx.QueryContext(ctx, q, tenant)
			if err != nil {
				return fmt.Errorf("apikeys: read tenant credentials: %w", err)
			}
			if own[i], err = scanCreds(rows); err != nil {
				return fmt.Errorf("apikeys: read tenant credentials: %w", err)
			}
		}
		for _, q := range []string{qRevokeKeysOfTenant, qRevokeSessionsOfTenant} {
			if _, err := tx.ExecContext(ctx, q, at, tenant); err != nil {
				return fmt.Errorf("apikeys: revoke tenant credentials: %w", err)
			}
		}
		made, err := RevokeMadeBy(ctx, tx, s.db.Dialect, at, append(credIDs(own[0]), credIDs(own[1])...))
		if err != nil {
			return err
		}
		mk, ms := countKinds(made)
		keys, sessions = int64(len(own[0]))+mk, int64(len(own[1]))+ms
		actor.TenantID, actor.Action, actor.Resource, actor.Outcome = tenant, "compute:tenants:delete", "tenant/"+tenant, "allowed"
		actor.Details = map[string]any{"step": "api-keys", "keys_revoked": keys, "sessions_revoked": sessions}
		if err := audit.Record(ctx, tx, now, actor); err != nil {
			return err
		}
		feed := append(credEntries(revwire.KindAPIKey, own[0], at, ReasonTenantDeleted), credEntries(revwire.KindSession, own[1], at, ReasonTenantDeleted)...)
		return revocations.AppendTx(ctx, tx, append(feed, made...)...)
	})
	if err == nil {
		s.accessChanged()
	}
	if err == nil && keys+sessions > 0 {
		s.revoked()
	}
	return keys, sessions, err
}
