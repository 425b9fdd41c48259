package secrets

import (
	"time"
)

// The secrets module's SQL. It names only the tables the module owns:
// secrets and secret_requests. What a command carries is asked of the
// commands module (LiveCommands), never read from its table here.
const (
	// sqlLatestVersion reads the latest version of a reference, deleted or
	// not, and its scope.
	sqlLatestVersion = `SELECT version, scope FROM secrets WHERE ref = $1 ORDER BY version DESC LIMIT 1`

	// sqlInsertVersion stores one sealed version.
	sqlInsertVersion = `INSERT INTO secrets (ref, version, tenant_id, name, scope, sealed, created_by, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`

	// sqlLockRef takes the transaction-scoped PostgreSQL advisory lock of
	// one reference (putLockClass, hash of the reference).
	sqlLockRef = `SELECT pg_advisory_xact_lock($1, hashtext($2))`

	// sqlLiveScope reads the scope of a reference's latest live version.
	sqlLiveScope = `SELECT scope FROM secrets WHERE ref = $1 AND deleted_at IS NULL ORDER BY version DESC LIMIT 1`

	// sqlDeleteRef marks every live version of a reference deleted.
	sqlDeleteRef = `UPDATE secrets SET deleted_at = $1 WHERE ref = $2 AND deleted_at IS NULL`

	// metaColumns are the columns scanMeta reads, in its order.
	metaColumns = `ref, tenant_id, name, version, scope, created_by, created_at`

	// sqlListLatest lists a tenant's live secrets at their latest versions.
	sqlListLatest = `SELECT ` + metaColumns + ` FROM secrets s
		WHERE tenant_id = $1 AND deleted_at IS NULL AND version = (SELECT MAX(version) FROM secrets x WHERE x.ref = s.ref) ORDER BY name`

	// sqlShowLatest reads a reference's latest live version.
	sqlShowLatest = `SELECT ` + metaColumns + ` FROM secrets
		WHERE ref = $1 AND deleted_at IS NULL ORDER BY version DESC LIMIT 1`

	// sqlExists tells whether a tenant holds a live version of a reference.
	sqlExists = `SELECT 1 FROM secrets WHERE ref = $1 AND tenant_id = $2 AND deleted_at IS NULL LIMIT 1`

	// sqlTenantScoped tells whether a tenant holds a live tenant-scoped
	// version of a reference.
	sqlTenantScoped = `SELECT 1 FROM secrets WHERE ref = $1 AND tenant_id = $2 AND scope = 'tenant' AND deleted_at IS NULL LIMIT 1`

	// sqlSealedLatest reads the sealed value and scope of a reference's
	// latest live version in its tenant, for a release.
	sqlSealedLatest = `SELECT version, sealed, scope FROM secrets WHERE ref = $1 AND tenant_id = $2 AND deleted_at IS NULL ORDER BY version DESC LIMIT 1`

	// sqlResealPage reads the next page of every version, live or deleted,
	// after (ref, version), for a KEK rotation.
	sqlResealPage = `SELECT ref, version, tenant_id, sealed FROM secrets
		WHERE ref > $1 OR (ref = $1 AND version > $2) ORDER BY ref, version LIMIT $3`

	// sqlResealRow replaces one version's sealed value, only if it is still
	// the one read.
	sqlResealRow = `UPDATE secrets SET sealed = $1 WHERE ref = $2 AND version = $3 AND sealed = $4`

	// sqlSpendRequest spends a request id; a second insert is a replay.
	sqlSpendRequest = `INSERT INTO secret_requests (request_id, node_id, at) VALUES ($1, $2, $3)`
)

// rowScanner is a *sql.Row or *sql.Rows.
type rowScanner interface {
	Scan(dest ...any) error
}

// scanMeta reads one row of metaColumns.
func scanMeta(r rowScanner) (Meta, error) {
	var m Meta
	var at int64
	if err := r.Scan(&m.Ref, &m.TenantID, &m.Name, &m.Version, &m.Scope, &m.CreatedBy, &at); err != nil {
		return Meta{}, err
	}
	m.CreatedAt = time.UnixMilli(at).UTC()
	return m, nil
}
