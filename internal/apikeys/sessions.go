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
		if _, err := tx.ExecContext(ctx, qInsertSession,
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
	st, err := s.db.Stmt(ctx, s.qSessionAuth)
	if err != nil {
		return Principal{}, err
	}
	a, err := scanSessionAuth(st.QueryRowContext(ctx, hash(value)))
	if errors.Is(err, sql.ErrNoRows) {
		return Principal{}, ErrInvalid
	}
	if err != nil {
		return Principal{}, fmt.Errorf("apikeys: read session: %w", err)
	}
	now := s.clk.Now().UnixMilli()
	if !credentialValid(a.rev, sql.NullInt64{Int64: a.exp, Valid: true}, now) || !credentialValid(a.keyRev, a.keyExp, now) {
		return Principal{}, ErrInvalid
	}
	if !a.identityOK {
		return Principal{}, ErrInvalid
	}
	if a.parent.Valid {
		ok, err := s.lineageValid(ctx, a.parent.String, now)
		if err != nil {
			return Principal{}, err
		}
		if !ok {
			return Principal{}, ErrInvalid
		}
	}
	p := a.p
	p.ExpiresAt = time.UnixMilli(a.exp)
	p.Scopes = splitScopes(a.scopes)
	return p, nil
}

// lineageValid reports whether the session id and every session above it
// are unrevoked and unexpired.
func (s *Service) lineageValid(ctx context.Context, id string, now int64) (bool, error) {
	st, err := s.db.Stmt(ctx, qSessionLineage)
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
	return s.revoke(ctx, actor, tenant, id, revokeSession)
}
