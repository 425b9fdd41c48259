package breakglass

// The module's SQL. It names only the module's own tables: ssh_certs,
// ssh_access_gen and ssh_access. Times are unix ms.
const (
	sqlInsertCert = `INSERT INTO ssh_certs (serial, tenant_id, node_id, account, identity_id, key_fingerprint, issued_at, valid_after, expires_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`
	// sqlLiveAccounts: the accounts with a certificate not revoked and not
	// expired at $2.
	sqlLiveAccounts = `SELECT DISTINCT account FROM ssh_certs WHERE node_id = $1 AND revoked_at IS NULL AND expires_at > $2 ORDER BY account`
	// sqlRevokedLive: the revoked serials whose certificates have not
	// expired at $2 (an expired certificate sshd refuses anyway).
	sqlRevokedLive = `SELECT serial FROM ssh_certs WHERE node_id = $1 AND revoked_at IS NOT NULL AND expires_at > $2 ORDER BY serial`
	sqlCertOfNode  = `SELECT tenant_id, revoked_at IS NOT NULL FROM ssh_certs WHERE serial = $1 AND node_id = $2`
	sqlRevokeCert  = `UPDATE ssh_certs SET revoked_at = $1, revoked_by = $2 WHERE serial = $3 AND revoked_at IS NULL`

	sqlEnsureGen   = `INSERT INTO ssh_access_gen (node_id, generation) VALUES ($1, 0) ON CONFLICT (node_id) DO NOTHING`
	sqlNextGen     = `UPDATE ssh_access_gen SET generation = generation + 1 WHERE node_id = $1 RETURNING generation`
	sqlLastAccess  = `SELECT payload FROM ssh_access WHERE node_id = $1 AND command_id <> '' ORDER BY generation DESC LIMIT 1`
	sqlLockGen     = `UPDATE ssh_access_gen SET generation = generation WHERE node_id = $1`
	sqlInsertState = `INSERT INTO ssh_access (node_id, generation, tenant_id, payload, created_at) VALUES ($1, $2, $3, $4, $5)`
	sqlSetCommand  = `UPDATE ssh_access SET command_id = $1 WHERE node_id = $2 AND generation = $3`
	// sqlQueuedStates: the node's states with a command, newest first.
	sqlQueuedStates = `SELECT command_id, payload FROM ssh_access WHERE node_id = $1 AND command_id <> '' ORDER BY generation DESC LIMIT 64`
)
