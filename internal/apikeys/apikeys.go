// Package apikeys issues and checks API keys and the sessions made from
// them. A key reads "bck_<id>_<secret>"; only SHA-256 of the whole key is
// stored, so the database never holds a usable key. A key is shown once,
// when made. No credential outlives the one that made it: a key or session
// made by a caller with an expiry expires no later, a session is valid
// only while its key, its identity and every session above it are, and
// revoking a key or session revokes the keys it made (and theirs).
package apikeys

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/revocations"
	"github.com/bettercompute/bettercompute/internal/revocations/revwire"
	"github.com/bettercompute/bettercompute/internal/store"
)

// Prefix starts every API key, so a leaked key is recognisable.
const Prefix = "bck_"

// Principal is who an API key (or a session) speaks for.
type Principal struct {
	// KeyID is the API key the caller presented, or for a session the key
	// at the root of its lineage.
	KeyID string
	// SessionID is set when the caller presented a session.
	SessionID string
	// HomeTenant is the tenant the credential's identity belongs to, which
	// is not always the tenant a call acts in (api.Caller.ActingTenant).
	HomeTenant string
	Identity   string
	// Scopes, when not empty, limit the actions the key may be used for
	// (action patterns); the identity's roles still decide. A session has
	// its key's scopes.
	Scopes []string
	// ExpiresAt is when the presented credential expires (zero: never); a
	// credential it makes expires no later.
	ExpiresAt time.Time
}

// Identities is what the API key store asks of the identity store (package
// iam implements it; iam imports apikeys, so it is injected).
type Identities interface {
	// IdentityInTenantTx reports, inside tx, whether identity id exists
	// in tenant.
	IdentityInTenantTx(ctx context.Context, tx *sql.Tx, id, tenant string) (bool, error)
	// ExistsCondition is an SQL condition, true when the identity in
	// idColumn exists in the tenant in tenantColumn: authentication reads
	// it in the same statement as the credential (one round trip a call)
	// without naming iam's table itself.
	ExistsCondition(idColumn, tenantColumn string) string
}

// Service is the API key store.
type Service struct {
	db         *store.DB
	clk        clock.Clock
	identities Identities
	// qKeyAuth and qSessionAuth are qKeyByHash and qSessionByHash with
	// iam's identity-exists condition filled in.
	qKeyAuth, qSessionAuth string
	// onRevoked is called after each committed revocation (OnRevoked).
	onRevoked func()
	// onAccessChanged is called after each committed revocation
	// (OnAccessChanged).
	onAccessChanged func()
}

// New returns the API key store. identities answers whether a key's
// identity still exists in its tenant.
func New(db *store.DB, clk clock.Clock, identities Identities) *Service {
	return &Service{db: db, clk: clk, identities: identities,
		qKeyAuth:     fmt.Sprintf(qKeyByHash, identities.ExistsCondition("api_keys.identity", "api_keys.tenant_id")),
		qSessionAuth: fmt.Sprintf(qSessionByHash, identities.ExistsCondition("s.identity_id", "s.tenant_id"))}
}

func hash(key string) []byte {
	h := sha256.Sum256([]byte(key))
	return h[:]
}

// Create makes a key for identity in tenant, valid for ttl (0: no expiry),
// limited to scopes when given, with its audit row. The key is returned
// once and never stored. The identity must belong to tenant.
func (s *Service) Create(ctx context.Context, actor audit.Entry, tenant, identity, name string, ttl time.Duration, scopes ...string) (id, key string, err error) {
	id, key, _, err = s.CreateFor(ctx, actor, Principal{}, tenant, identity, name, ttl, scopes...)
	return id, key, err
}

// Limit returns the expiry of a credential the caller makes for ttl (0: no
// expiry) at now: never later than the caller's own expiry (zero: none).
func Limit(caller Principal, now time.Time, ttl time.Duration) time.Time {
	var exp time.Time
	if ttl > 0 {
		exp = now.Add(ttl)
	}
	if !caller.ExpiresAt.IsZero() && (exp.IsZero() || exp.After(caller.ExpiresAt)) {
		exp = caller.ExpiresAt
	}
	return exp
}

// CreateFor is Create on behalf of caller: the key expires no later than
// the caller's credential (a caller whose key has no expiry may make any),
// a scoped caller makes only keys within its scopes (its own scopes when
// none are asked for), and the key records the caller's credential (its
// session, else its key) as its maker, so revoking that revokes the key.
// It returns the key's expiry (zero: none).
func (s *Service) CreateFor(ctx context.Context, actor audit.Entry, caller Principal, tenant, identity, name string, ttl time.Duration, scopes ...string) (id, key string, expires time.Time, err error) {
	id = ids.New("k")
	key = Prefix + id + "_" + ids.Secret(32)
	now := s.clk.Now()
	expires = Limit(caller, now, ttl)
	var exp any
	if !expires.IsZero() {
		exp = expires.UnixMilli()
	}
	for _, sc := range scopes {
		if sc == "" || strings.ContainsAny(sc, " ,") || len(sc) > 128 {
			return "", "", time.Time{}, errs.New(errs.InvalidInput, "scopes: action patterns without spaces or commas")
		}
		if len(caller.Scopes) > 0 && !slices.Contains(caller.Scopes, sc) {
			return "", "", time.Time{}, errs.New(errs.InvalidInput, "scopes: a scoped key makes keys only within its own scopes")
		}
	}
	if len(scopes) == 0 {
		scopes = caller.Scopes
	}
	var madeBy any
	if m := maker(caller); m != "" {
		madeBy = m
	}
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		// The maker must still be valid when the key is recorded, and stays
		// so until it is: its revocation revokes this key too.
		if madeBy != nil {
			ok, err := holdMaker(ctx, tx, caller.SessionID != "", maker(caller), caller.HomeTenant, caller.Identity)
			if err != nil {
				return err
			}
			if !ok {
				return ErrInvalid
			}
		}
		if ok, err := s.identities.IdentityInTenantTx(ctx, tx, identity, tenant); err != nil {
			return fmt.Errorf("apikeys: read identity: %w", err)
		} else if !ok {
			return errs.New(errs.InvalidInput, "identity_id: no such identity in this tenant")
		}
		if _, err := tx.ExecContext(ctx, qInsertKey,
			id, tenant, identity, name, hash(key), strings.Join(scopes, ","), now.UnixMilli(), exp, madeBy); err != nil {
			return fmt.Errorf("apikeys: insert: %w", err)
		}
		actor.Action, actor.Resource, actor.Outcome = "compute:api-keys:create", "api-key/"+id, "allowed"
		actor.Details = map[string]any{"tenant_id": tenant, "identity": identity}
		if madeBy != nil {
			actor.Details["made_by"] = madeBy
		}
		if exp != nil {
			actor.Details["expires_at"] = exp
		}
		return audit.Record(ctx, tx, now, actor)
	})
	if err != nil {
		return "", "", time.Time{}, err
	}
	return id, key, expires, nil
}

// ErrInvalid is the one answer for a missing, unknown, expired or revoked
// key (UNAUTHENTICATED), so a caller learns nothing about which.
var ErrInvalid = errs.New(errs.Unauthenticated, "a valid API key is required")

// Authenticate returns the principal for key. The key must be unexpired,
// unrevoked, and its identity must still exist in its tenant.
func (s *Service) Authenticate(ctx context.Context, key string) (Principal, error) {
	if !strings.HasPrefix(key, Prefix) || len(key) > 200 {
		return Principal{}, ErrInvalid
	}
	st, err := s.db.Stmt(ctx, s.qKeyAuth)
	if err != nil {
		return Principal{}, err
	}
	k, err := scanKeyAuth(st.QueryRowContext(ctx, hash(key)))
	if errors.Is(err, sql.ErrNoRows) {
		return Principal{}, ErrInvalid
	}
	if err != nil {
		return Principal{}, fmt.Errorf("apikeys: read: %w", err)
	}
	if !credentialValid(k.revoked, k.exp, s.clk.Now().UnixMilli()) {
		return Principal{}, ErrInvalid
	}
	if !k.identityOK {
		return Principal{}, ErrInvalid
	}
	p := k.p
	if k.exp.Valid {
		p.ExpiresAt = time.UnixMilli(k.exp.Int64)
	}
	p.Scopes = splitScopes(k.scopes)
	return p, nil
}

// credentialValid is the validity of a key (or session) row at now (unix
// ms): unrevoked, and unexpired when it has an expiry.
func credentialValid(revoked, exp sql.NullInt64, now int64) bool {
	return !revoked.Valid && (!exp.Valid || now < exp.Int64)
}

// Key is a key's metadata; the key itself is never stored or shown again.
type Key struct {
	ID        string     `json:"id"`
	TenantID  string     `json:"tenant_id"`
	Identity  string     `json:"identity_id"`
	Name      string     `json:"name"`
	Scopes    []string   `json:"scopes"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// List returns the keys of tenant.
func (s *Service) List(ctx context.Context, tenant string) ([]Key, error) {
	rows, err := s.db.QueryContext(ctx, qListKeys, tenant)
	if err != nil {
		return nil, fmt.Errorf("apikeys: list: %w", err)
	}
	defer rows.Close()
	out := []Key{}
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// TenantOf returns a key's tenant; NOT_FOUND when unknown.
func (s *Service) TenantOf(ctx context.Context, id string) (string, error) {
	var t string
	err := s.db.QueryRowContext(ctx, qKeyTenant, id).Scan(&t)
	if errors.Is(err, sql.ErrNoRows) {
		return "", errs.New(errs.NotFound, "api key not found")
	}
	if err != nil {
		return "", fmt.Errorf("apikeys: tenant of: %w", err)
	}
	return t, nil
}

// Revoke revokes a key of tenant, and every session and key made from it
// (at any depth, RevokeMadeBy).
func (s *Service) Revoke(ctx context.Context, actor audit.Entry, tenant, id string) error {
	return s.revoke(ctx, actor, tenant, id, revokeKey)
}

// revocation is what differs between revoking a key and a session.
type revocation struct {
	update   string // the statement that revokes the credential: (at, id, tenant)
	what     string // the error context
	notFound string // the NOT_FOUND message
	action   string // the audit action
	resource string // the audit resource prefix
	sessions string // the audit detail counting the sessions revoked below
	kind     string // the revocation feed's kind (revwire)
}

var (
	revokeKey = revocation{update: qRevokeKey, what: "revoke", notFound: "api key not found or already revoked",
		action: "compute:api-keys:revoke", resource: "api-key/", sessions: "sessions_revoked", kind: revwire.KindAPIKey}
	revokeSession = revocation{update: qRevokeSession, what: "revoke session", notFound: "session not found or already revoked",
		action: "compute:sessions:revoke", resource: "session/", sessions: "sessions_below_revoked", kind: revwire.KindSession}
)

// revoke revokes the credential id of tenant (a key or a session, per r)
// and every session and key made from it, with its audit row and their
// revocation-feed entries, in one transaction; NOT_FOUND when tenant has
// no such unrevoked credential.
func (s *Service) revoke(ctx context.Context, actor audit.Entry, tenant, id string, r revocation) error {
	now := s.clk.Now()
	err := s.db.Tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, r.update, now.UnixMilli(), id, tenant)
		if err != nil {
			return fmt.Errorf("apikeys: %s: %w", r.what, err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return errs.New(errs.NotFound, r.notFound)
		}
		// Sessions and keys made from it, at any depth.
		made, err := RevokeMadeBy(ctx, tx, s.db.Dialect, now.UnixMilli(), []string{id})
		if err != nil {
			return err
		}
		keys, sessions := countKinds(made)
		actor.Action, actor.Resource, actor.Outcome = r.action, r.resource+id, "allowed"
		actor.Details = map[string]any{r.sessions: sessions, "keys_revoked": keys}
		if err := audit.Record(ctx, tx, now, actor); err != nil {
			return err
		}
		own := revwire.Entry{Kind: r.kind, Subject: id, TenantID: tenant, At: now, Reason: ReasonRevoked}
		return revocations.AppendTx(ctx, tx, append([]revwire.Entry{own}, made...)...)
	})
	if err == nil {
		s.accessChanged()
		s.revoked()
	}
	return err
}

// RevokeForIdentityTx revokes, inside tx at time at (unix ms), every key
// and session of identity (of tenant) and everything they made
// (RevokeMadeBy, keys made for other identities included), and appends
// the identity's, and each credential's, entry to the revocation feed:
// the identity store calls it in the transaction that deletes the
// identity, after its own writes.
func RevokeForIdentityTx(ctx context.Context, tx *sql.Tx, d store.Dialect, tenant, identity string, at int64) error {
	var own []revwire.Entry
	var made []string
	for i, q := range []string{qKeysOfIdentity, qSessionsOfIdentity} {
		rows, err := tx.QueryContext(ctx, q, identity)
		if err != nil {
			return fmt.Errorf("apikeys: read credentials: %w", err)
		}
		found, err := scanCreds(rows)
		if err != nil {
			return fmt.Errorf("apikeys: read credentials: %w", err)
		}
		kind := revwire.KindAPIKey
		if i == 1 {
			kind = revwire.KindSession
		}
		own = append(own, credEntries(kind, found, at, ReasonIdentityDeleted)...)
		made = append(made, credIDs(found)...)
	}
	for _, q := range []string{qRevokeKeysOfIdentity, qRevokeSessionsOfIdentity} {
		if _, err := tx.ExecContext(ctx, q, at, identity); err != nil {
			return fmt.Errorf("apikeys: revoke credentials: %w", err)
		}
	}
	below, err := RevokeMadeBy(ctx, tx, d, at, made)
	if err != nil {
		return err
	}
	id := revwire.Entry{Kind: revwire.KindIdentity, Subject: identity, TenantID: tenant, At: time.UnixMilli(at).UTC(), Reason: ReasonIdentityDeleted}
	return revocations.AppendTx(ctx, tx, append(append([]revwire.Entry{id}, own...), below...)...)
}
