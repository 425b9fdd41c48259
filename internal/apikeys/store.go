package apikeys

import (
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/internal/store"
)

// The apikeys module owns the api_keys and sessions tables; this file holds
// every statement it runs on them and their row codecs. Whether an
// identity exists in its tenant is asked of the identity store
// (Identities), never read here.

const (
	qInsertKey = `INSERT INTO api_keys (id, tenant_id, identity, name, hash, scopes, created_at, expires_at, made_by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`
	// qKeyByHash and qSessionByHash end their column lists with %s: the
	// identity-exists condition iam provides (Identities.ExistsCondition),
	// so that authentication stays one statement a call.
	qKeyByHash = `SELECT id, tenant_id, identity, scopes, expires_at, revoked_at, %s FROM api_keys WHERE hash = $1`
	qListKeys  = `SELECT id, tenant_id, identity, name, scopes, created_at, expires_at, revoked_at FROM api_keys WHERE tenant_id = $1 ORDER BY created_at, id`
	qKeyTenant = `SELECT tenant_id FROM api_keys WHERE id = $1`
	qRevokeKey = `UPDATE api_keys SET revoked_at = $1 WHERE id = $2 AND tenant_id = $3 AND revoked_at IS NULL`
	qHoldKey   = `UPDATE api_keys SET revoked_at = revoked_at WHERE id = $1 AND tenant_id = $2 AND identity = $3 AND revoked_at IS NULL`

	qKeysOfIdentity       = `SELECT id, tenant_id FROM api_keys WHERE identity = $1 AND revoked_at IS NULL`
	qRevokeKeysOfIdentity = `UPDATE api_keys SET revoked_at = $1 WHERE identity = $2 AND revoked_at IS NULL`

	qInsertSession = `INSERT INTO sessions (id, hash, tenant_id, identity_id, created_at, expires_at, key_id, parent_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`
	qSessionByHash = `SELECT s.id, s.tenant_id, s.identity_id, s.expires_at, s.revoked_at, s.parent_id, k.id, k.scopes, k.expires_at, k.revoked_at, %s
		FROM sessions s
		JOIN api_keys k ON k.id = s.key_id AND k.identity = s.identity_id AND k.tenant_id = s.tenant_id
		WHERE s.hash = $1`
	qSessionLineage = `WITH RECURSIVE up(id, parent_id, expires_at, revoked_at, depth) AS (
			SELECT id, parent_id, expires_at, revoked_at, 0 FROM sessions WHERE id = $1
			UNION ALL
			SELECT s.id, s.parent_id, s.expires_at, s.revoked_at, u.depth + 1 FROM sessions s JOIN up u ON s.id = u.parent_id WHERE u.depth < $2
		) SELECT COUNT(*), COALESCE(SUM(CASE WHEN revoked_at IS NULL AND expires_at > $3 THEN 1 ELSE 0 END), 0) FROM up`
	qRevokeSession = `UPDATE sessions SET revoked_at = $1 WHERE id = $2 AND tenant_id = $3 AND revoked_at IS NULL`
	qHoldSession   = `UPDATE sessions SET revoked_at = revoked_at WHERE id = $1 AND tenant_id = $2 AND identity_id = $3 AND revoked_at IS NULL`

	// qCountKeysOf counts the keys (revoked or not) of tenant $1 held by
	// the identities in %s (CreateFirst); qLockKeys makes concurrent
	// CreateFirst calls on PostgreSQL take turns (SQLite's write
	// transactions already do).
	qCountKeysOf = `SELECT COUNT(*) FROM api_keys WHERE tenant_id = $1 AND identity IN (%s)`
	qLockKeys    = `LOCK TABLE api_keys IN SHARE ROW EXCLUSIVE MODE`

	qSessionsOfIdentity       = `SELECT id, tenant_id FROM sessions WHERE identity_id = $1 AND revoked_at IS NULL`
	qRevokeSessionsOfIdentity = `UPDATE sessions SET revoked_at = $1 WHERE identity_id = $2 AND revoked_at IS NULL`
)

// The tables a made-credential cascade walks (revokeWhere names them).
const (
	tableKeys     = "api_keys"
	tableSessions = "sessions"
)

// keysMadeBy is the condition on api_keys of the keys made by the
// credentials ids (their placeholders added to a).
func keysMadeBy(a *store.Args, ids []string) string {
	return `made_by IN (` + a.Strings(ids) + `)`
}

// sessionsMadeBy is the condition on sessions of the sessions made by the
// credentials ids: from a key among them, or below a session among them.
func sessionsMadeBy(a *store.Args, ids []string) string {
	return `(key_id IN (` + a.Strings(ids) + `) OR parent_id IN (` + a.Strings(ids) + `))`
}

// selectUnrevoked reads the ids and tenants of the unrevoked rows of
// table (tableKeys or tableSessions) that meet cond.
func selectUnrevoked(table, cond string) string {
	return `SELECT id, tenant_id FROM ` + table + ` WHERE revoked_at IS NULL AND ` + cond
}

// revokeIDs revokes, at the placeholder at, the unrevoked rows of table
// whose id is in the placeholder list ids.
func revokeIDs(table, at, ids string) string {
	return `UPDATE ` + table + ` SET revoked_at = ` + at + ` WHERE revoked_at IS NULL AND id IN (` + ids + `)`
}

type scanner interface{ Scan(dest ...any) error }

// keyAuth is the row Authenticate reads for a key.
type keyAuth struct {
	p            Principal
	scopes       string
	exp, revoked sql.NullInt64
	identityOK   bool
}

func scanKeyAuth(s scanner) (keyAuth, error) {
	var k keyAuth
	err := s.Scan(&k.p.KeyID, &k.p.HomeTenant, &k.p.Identity, &k.scopes, &k.exp, &k.revoked, &k.identityOK)
	return k, err
}

// sessionAuth is the row AuthenticateSession reads for a session and its
// key.
type sessionAuth struct {
	p              Principal
	exp            int64
	rev            sql.NullInt64
	parent         sql.NullString
	scopes         string
	keyExp, keyRev sql.NullInt64
	identityOK     bool
}

func scanSessionAuth(s scanner) (sessionAuth, error) {
	var a sessionAuth
	err := s.Scan(&a.p.SessionID, &a.p.HomeTenant, &a.p.Identity, &a.exp, &a.rev, &a.parent, &a.p.KeyID, &a.scopes, &a.keyExp, &a.keyRev, &a.identityOK)
	return a, err
}

// splitScopes decodes the stored scopes column ("" for none).
func splitScopes(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// scanKey decodes a row of qListKeys.
func scanKey(s scanner) (Key, error) {
	var k Key
	var scopes string
	var created int64
	var exp, rev sql.NullInt64
	if err := s.Scan(&k.ID, &k.TenantID, &k.Identity, &k.Name, &scopes, &created, &exp, &rev); err != nil {
		return Key{}, fmt.Errorf("apikeys: scan: %w", err)
	}
	k.Scopes = []string{}
	if scopes != "" {
		k.Scopes = strings.Split(scopes, ",")
	}
	k.CreatedAt = time.UnixMilli(created).UTC()
	k.ExpiresAt = msTime(exp)
	k.RevokedAt = msTime(rev)
	return k, nil
}

// msTime decodes a nullable unix-millisecond column.
func msTime(v sql.NullInt64) *time.Time {
	if !v.Valid {
		return nil
	}
	t := time.UnixMilli(v.Int64).UTC()
	return &t
}
