package apikeys

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/store"
)

// ErrNotFirst refuses CreateFirst once one of the holders has a key.
var ErrNotFirst = errs.New(errs.Conflict, "an admin key already exists in this tenant")

// CreateFirst makes a key for identity in tenant (no expiry, no scopes)
// only when none of holders (the identities whose keys count as admin
// keys, identity among them) has ever had a key in tenant, revoked or not;
// otherwise it returns ErrNotFirst. The check, the key and its audit row
// are one transaction, and concurrent calls take turns, so two bootstraps
// cannot both succeed.
func (s *Service) CreateFirst(ctx context.Context, actor audit.Entry, tenant, identity, name string, holders []string) (id, key string, err error) {
	id = ids.New("k")
	key = Prefix + id + "_" + ids.Secret(32)
	now := s.clk.Now()
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		if s.db.Dialect == store.Postgres {
			if _, err := tx.ExecContext(ctx, qLockKeys); err != nil {
				return fmt.Errorf("apikeys: lock: %w", err)
			}
		}
		a := s.db.NewArgs()
		a.Add(tenant)
		var n int
		if err := tx.QueryRowContext(ctx, fmt.Sprintf(qCountKeysOf, a.Strings(append([]string{identity}, holders...))), a.Values()...).Scan(&n); err != nil {
			return fmt.Errorf("apikeys: count keys: %w", err)
		}
		if n > 0 {
			return ErrNotFirst
		}
		if ok, err := s.identities.IdentityInTenantTx(ctx, tx, identity, tenant); err != nil {
			return fmt.Errorf("apikeys: read identity: %w", err)
		} else if !ok {
			return errs.New(errs.InvalidInput, "identity_id: no such identity in this tenant")
		}
		if _, err := tx.ExecContext(ctx, qInsertKey, id, tenant, identity, name, hash(key), "", now.UnixMilli(), nil, nil); err != nil {
			return fmt.Errorf("apikeys: insert: %w", err)
		}
		actor.Action, actor.Resource, actor.Outcome = "compute:api-keys:create", "api-key/"+id, "allowed"
		actor.Details = map[string]any{"tenant_id": tenant, "identity": identity, "bootstrap": true}
		return audit.Record(ctx, tx, now, actor)
	})
	if err != nil {
		return "", "", err
	}
	return id, key, nil
}
