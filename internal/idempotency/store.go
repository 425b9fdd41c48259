package idempotency

// The idempotency table's SQL: this package is the only one that names
// the table. A row is keyed by (tenant_id, identity_id, key); status 0
// marks a request still running under its lease.
const (
	sqlWhere  = ` WHERE tenant_id = $1 AND identity_id = $2 AND key = $3`
	sqlInsert = `INSERT INTO idempotency (tenant_id, identity_id, key, method, body_sha256, status, created_at, lease_expires_at) VALUES ($1, $2, $3, $4, $5, 0, $6, $7)`
	sqlRead   = `SELECT body_sha256, status, response, created_at, lease_expires_at FROM idempotency` + sqlWhere
	sqlExpire = `DELETE FROM idempotency` + sqlWhere + ` AND created_at = $4`
	// sqlTakeOver extends the lease of a running row only if it is still
	// the lease that was read (another request may have taken it first).
	sqlTakeOver = `UPDATE idempotency SET lease_expires_at = $4` + sqlWhere + ` AND status = 0 AND lease_expires_at = $5`
	sqlForget   = `DELETE FROM idempotency` + sqlWhere
	sqlFinish   = `UPDATE idempotency SET status = $4, response = $5, lease_expires_at = 0` + sqlWhere
	sqlRenew    = `UPDATE idempotency SET lease_expires_at = $1 WHERE tenant_id = $2 AND identity_id = $3 AND key = $4 AND status = 0`
	sqlSweep    = `DELETE FROM idempotency WHERE created_at <= $1 AND (status <> 0 OR lease_expires_at <= $2)`
)

// row is one idempotency row as read back.
type row struct {
	digest   []byte
	status   int
	response []byte
	created  int64 // Unix ms
	lease    int64 // Unix ms; 0 once finished
}
