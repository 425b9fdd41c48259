package bastions

// The bastions module's SQL. It names only the tables the module owns:
// bastions, bastion_grants and bastion_keys. What a node is (its tenant,
// role, name and session) is asked of the nodes module, never read from
// its tables here.
const (
	// sqlAdopt records a bastion node's row, paired, unless it has one.
	sqlAdopt = `INSERT INTO bastions (node_id, tenant_id, name, state, created_at_ms) VALUES ($1, $2, $3, 'paired', $4)
		ON CONFLICT (node_id) DO NOTHING`

	// sqlBastionRow reads one bastion's row.
	sqlBastionRow = `SELECT node_id, tenant_id, name, wg_public_key, tunnel_addr, state, created_at_ms, unpaired_at_ms
		FROM bastions WHERE node_id = $1`

	// sqlBastionsOf reads the bastion rows of an IN list (appended by the
	// caller).
	sqlBastionsOf = `SELECT node_id, tenant_id, name, wg_public_key, tunnel_addr, state, created_at_ms, unpaired_at_ms
		FROM bastions WHERE node_id IN (`

	// sqlUsedAddrs reads every tunnel address ever allocated (an unpaired
	// bastion keeps its address, so none is ever handed out twice).
	sqlUsedAddrs = `SELECT tunnel_addr FROM bastions WHERE tunnel_addr IS NOT NULL`

	// sqlLockAddrs takes the transaction-scoped PostgreSQL advisory lock
	// that serialises tunnel address allocation (addrLockClass, 0).
	sqlLockAddrs = `SELECT pg_advisory_xact_lock($1, 0)`

	// sqlSetTunnel records a bastion's WireGuard key and tunnel address.
	sqlSetTunnel = `UPDATE bastions SET wg_public_key = $1, tunnel_addr = $2 WHERE node_id = $3 AND state = 'paired'`

	// sqlPeers reads the paired bastions that said hello.
	sqlPeers = `SELECT node_id, wg_public_key, tunnel_addr FROM bastions
		WHERE state = 'paired' AND wg_public_key IS NOT NULL AND tunnel_addr IS NOT NULL ORDER BY node_id`

	// sqlUnpair marks a bastion unpaired (once: the first time stays).
	sqlUnpair = `UPDATE bastions SET state = 'unpaired', unpaired_at_ms = $1 WHERE node_id = $2 AND state = 'paired'`

	// sqlInsertGrant stores one signed grant.
	sqlInsertGrant = `INSERT INTO bastion_grants (id, tenant_id, bastion_id, signed, allow_json, deny_json, models_json, reach_json,
		created_at_ms, expires_at_ms, created_by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`

	// grantColumns are the columns scanGrant reads, in its order.
	grantColumns = `id, tenant_id, bastion_id, allow_json, deny_json, models_json, reach_json, created_at_ms, expires_at_ms, revoked_at_ms, created_by`

	// sqlGrantsOf lists a bastion's grants, newest first.
	sqlGrantsOf = `SELECT ` + grantColumns + ` FROM bastion_grants WHERE bastion_id = $1 ORDER BY created_at_ms DESC, id`

	// sqlLiveGrantsIn lists the live (unrevoked, unexpired) grants of the
	// bastions of an IN list (appended by the caller after $1, the time).
	sqlLiveGrantsIn = `SELECT ` + grantColumns + ` FROM bastion_grants
		WHERE revoked_at_ms IS NULL AND expires_at_ms > $1 AND bastion_id IN (`

	// sqlLiveSigned reads a bastion's live signed grants, oldest first.
	sqlLiveSigned = `SELECT signed FROM bastion_grants
		WHERE bastion_id = $1 AND revoked_at_ms IS NULL AND expires_at_ms > $2 ORDER BY created_at_ms, id`

	// sqlGrantTenant reads a grant's tenant and bastion.
	sqlGrantTenant = `SELECT tenant_id, bastion_id FROM bastion_grants WHERE id = $1`

	// sqlRevokeGrant revokes a grant once.
	sqlRevokeGrant = `UPDATE bastion_grants SET revoked_at_ms = $1 WHERE id = $2 AND tenant_id = $3 AND revoked_at_ms IS NULL`

	// sqlReadKey reads one of the control plane's bastion keys.
	sqlReadKey = `SELECT sealed, public_key FROM bastion_keys WHERE name = $1`

	// sqlInsertKey stores a key unless another process stored it first.
	sqlInsertKey = `INSERT INTO bastion_keys (name, sealed, public_key, created_at_ms) VALUES ($1, $2, $3, $4)
		ON CONFLICT (name) DO NOTHING`

	// sqlResealKeys reads every sealed key, for a KEK rotation.
	sqlResealKeys = `SELECT name, sealed FROM bastion_keys ORDER BY name`

	// sqlResealKey replaces one key's sealed form, only if it is still the
	// one read.
	sqlResealKey = `UPDATE bastion_keys SET sealed = $1 WHERE name = $2 AND sealed = $3`
)
