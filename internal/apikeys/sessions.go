package apikeys

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/ids"
)

// SessionPrefix starts every session cookie value.
const SessionPrefix = "bcs_"

// SessionLifetime is the longest a session lives; it is shorter when the
// credential that made it expires sooner.
const SessionLifetime = 12 * time.Hour

// maxSessionDepth bounds a lineage of sessions made by sessions.
const maxSessionDepth = 8

// Session is a session made by CreateSession; Value is shown once and
// only its hash is stored.
type Session struct {
	ID        string
	Value     string
	ExpiresAt time.Time
}

// CreateSession makes a browser session for the caller p, valid for at
// most ttl and never past p's own expiry. The session records the key (and
// the session, when p is one) that made it, and has that key's scopes; it
// is valid only while they are. Only its hash is stored; the value goes
// into an HttpOnly cookie.
func (s *Service) CreateSession(ctx context.Context, actor audit.Entry, p Principal, ttl time.Duration) (Session, error) {
	if p.KeyID == "" {
		return Session{}, errs.New(errs.InvalidState, "a session is made only with an API key or a session")
	}
	id := ids.New("ss")
	out := Session{ID: id, Value: SessionPrefix + id + "_" + ids.Secret(32)}
	now := s.clk.Now()
	if ttl <= 0 || ttl > SessionLifetime {
		ttl = SessionLifetime
	}
	out.ExpiresAt = Limit(p, now, ttl)
	var parent any
	if p.SessionID != "" {
		parent = p.SessionID
	}
	err := s.db.Tx(ctx, func(tx *sql.Tx) error {
		// The maker must still be valid when the session is recorded: a
		// key revoked since the caller authenticated makes nothing.
		// Its row is held until the session is recorded, so a revocation
		// cascades to the new session or waits for it.
		ok, err := holdMaker(ctx, tx, false, p.KeyID, p.HomeTenant, p.Identity)
		if err == nil && ok && p.SessionID != "" {
			ok, err = holdMaker(ctx, tx, true, p.SessionID, p.HomeTenant, p.Identity)
		}
		if err != nil {
			return err
		}
		if !ok {
			return ErrInvalid
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO sessions (id, hash, tenant_id, identity_id, created_at, expires_at, key_id, parent_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
			id, hash(out.Value), p.HomeTenant, p.Identity, now.UnixMilli(), out.ExpiresAt.UnixMilli(), p.KeyID, parent); err != nil {
			return fmt.Errorf("apikeys: insert session: %w", err)
		}
		actor.Action, actor.Resource, actor.Outcome = "compute:sessions:create", "session/"+id, "allowed"
		actor.Details = map[string]any{"key_id": p.KeyID, "expires_at": out.ExpiresAt.UnixMilli()}
		if p.SessionID != "" {
			actor.Details["parent_id"] = p.SessionID
		}
		return audit.Record(ctx, tx, now, actor)
	})
	if err != nil {
		return Session{}, err
	}
	return out, nil
}

// AuthenticateSession returns the principal of a session cookie value. The
// session must be unexpired and unrevoked, and so must the key it was made
// from and every session above it; its identity must still exist in its
// tenant. Any other answer is ErrInvalid.
func (s *Service) AuthenticateSession(ctx context.Context, value string) (Principal, error) {
	if !strings.HasPrefix(value, SessionPrefix) || len(value) > 200 {
		return Principal{}, ErrInvalid
	}
	var p Principal
	var exp int64
	var rev, keyExp, keyRev sql.NullInt64
	var parent sql.NullString
	var scopes string
	st, err := s.db.Stmt(ctx, `SELECT s.id, s.tenant_id, s.identity_id, s.expires_at, s.revoked_at, s.parent_id, k.id, k.scopes, k.expires_at, k.revoked_at
		FROM sessions s
		JOIN api_keys k ON k.id = s.key_id AND k.identity = s.identity_id AND k.tenant_id = s.tenant_id
		JOIN identities i ON i.id = s.identity_id AND i.tenant_id = s.tenant_id
		WHERE s.hash = $1`)
	if err != nil {
		return Principal{}, err
	}
	err = st.QueryRowContext(ctx, hash(value)).Scan(&p.SessionID, &p.HomeTenant, &p.Identity, &exp, &rev, &parent, &p.KeyID, &scopes, &keyExp, &keyRev)
	if errors.Is(err, sql.ErrNoRows) {
		return Principal{}, ErrInvalid
	}
	if err != nil {
		return Principal{}, fmt.Errorf("apikeys: read session: %w", err)
	}
	now := s.clk.Now().UnixMilli()
	if rev.Valid || now >= exp || keyRev.Valid || keyExp.Valid && now >= keyExp.Int64 {
		return Principal{}, ErrInvalid
	}
	if parent.Valid {
		ok, err := s.lineageValid(ctx, parent.String, now)
		if err != nil {
			return Principal{}, err
		}
		if !ok {
			return Principal{}, ErrInvalid
		}
	}
	p.ExpiresAt = time.UnixMilli(exp)
	if scopes != "" {
		p.Scopes = strings.Split(scopes, ",")
	}
	return p, nil
}

// lineageValid reports whether the session id and every session above it
// are unrevoked and unexpired.
func (s *Service) lineageValid(ctx context.Context, id string, now int64) (bool, error) {
	st, err := s.db.Stmt(ctx, `WITH RECURSIVE up(id, parent_id, expires_at, revoked_at, depth) AS (
			SELECT id, parent_id, expires_at, revoked_at, 0 FROM sessions WHERE id = $1
			UNION ALL
			SELECT s.id, s.parent_id, s.expires_at, s.revoked_at, u.depth + 1 FROM sessions s JOIN up u ON s.id = u.parent_id WHERE u.depth < $2
		) SELECT COUNT(*), COALESCE(SUM(CASE WHEN revoked_at IS NULL AND expires_at > $3 THEN 1 ELSE 0 END), 0) FROM up`)
	if err != nil {
		return false, err
	}
	var total, good int
	if err := st.QueryRowContext(ctx, id, maxSessionDepth, now).Scan(&total, &good); err != nil {
		return false, fmt.Errorf("apikeys: read session lineage: %w", err)
	}
	return total > 0 && total == good && total <= maxSessionDepth, nil
}

// RevokeSession revokes a session of tenant and every session and key
// made from it (at any depth, RevokeMadeBy); NOT_FOUND when tenant has no
// such unrevoked session.
func (s *Service) RevokeSession(ctx context.Context, actor audit.Entry, tenant, id string) error {
	now := s.clk.Now()
	return s.db.Tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE sessions SET revoked_at = $1 WHERE id = $2 AND tenant_id = $3 AND revoked_at IS NULL`, now.UnixMilli(), id, tenant)
		if err != nil {
			return fmt.Errorf("apikeys: revoke session: %w", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return errs.New(errs.NotFound, "session not found or already revoked")
		}
		// Sessions and keys made from it, at any depth.
		keys, sessions, err := RevokeMadeBy(ctx, tx, s.db.Dialect, now.UnixMilli(), []string{id})
		if err != nil {
			return err
		}
		actor.Action, actor.Resource, actor.Outcome = "compute:sessions:revoke", "session/"+id, "allowed"
		actor.Details = map[string]any{"sessions_below_revoked": sessions, "keys_revoked": keys}
		return audit.Record(ctx, tx, now, actor)
	})
}
