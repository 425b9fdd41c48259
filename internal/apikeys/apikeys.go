// Package apikeys issues and checks API keys. A key reads
// "bck_<id>_<secret>"; only SHA-256 of the whole key is stored, so the
// database never holds a usable key. A key is shown once, when made.
package apikeys

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/store"
)

// Prefix starts every API key, so a leaked key is recognisable.
const Prefix = "bck_"

// Principal is who an API key speaks for.
type Principal struct {
	KeyID    string
	TenantID string
	Identity string
}

// Service is the API key store.
type Service struct {
	db  *store.DB
	clk clock.Clock
}

// New returns the API key store.
func New(db *store.DB, clk clock.Clock) *Service { return &Service{db: db, clk: clk} }

func hash(key string) []byte {
	h := sha256.Sum256([]byte(key))
	return h[:]
}

// Create makes a key for identity in tenant, valid for ttl (0: no expiry),
// with its audit row. The key is returned once and never stored.
func (s *Service) Create(ctx context.Context, actor audit.Entry, tenant, identity, name string, ttl time.Duration) (id, key string, err error) {
	id = ids.New("k")
	key = Prefix + id + "_" + ids.Secret(32)
	now := s.clk.Now()
	var exp any
	if ttl > 0 {
		exp = now.Add(ttl).UnixMilli()
	}
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO api_keys (id, tenant_id, identity, name, hash, created_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
			id, tenant, identity, name, hash(key), now.UnixMilli(), exp); err != nil {
			return fmt.Errorf("apikeys: insert: %w", err)
		}
		actor.Action, actor.Resource, actor.Outcome = "compute:api-keys:create", "api-key/"+id, "allowed"
		actor.Details = map[string]any{"tenant_id": tenant, "identity": identity}
		return audit.Record(ctx, tx, now, actor)
	})
	return id, key, err
}

// ErrInvalid is the one answer for a missing, unknown, expired or revoked
// key (UNAUTHENTICATED), so a caller learns nothing about which.
var ErrInvalid = errs.New(errs.Unauthenticated, "a valid API key is required")

// Authenticate returns the principal for key.
func (s *Service) Authenticate(ctx context.Context, key string) (Principal, error) {
	if !strings.HasPrefix(key, Prefix) || len(key) > 200 {
		return Principal{}, ErrInvalid
	}
	var p Principal
	var exp, revoked sql.NullInt64
	err := s.db.QueryRowContext(ctx, `SELECT id, tenant_id, identity, expires_at, revoked_at FROM api_keys WHERE hash = $1`, hash(key)).
		Scan(&p.KeyID, &p.TenantID, &p.Identity, &exp, &revoked)
	if errors.Is(err, sql.ErrNoRows) {
		return Principal{}, ErrInvalid
	}
	if err != nil {
		return Principal{}, fmt.Errorf("apikeys: read: %w", err)
	}
	if revoked.Valid || exp.Valid && s.clk.Now().UnixMilli() >= exp.Int64 {
		return Principal{}, ErrInvalid
	}
	return p, nil
}
