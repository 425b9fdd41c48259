package revocations

// The module's SQL: its tables are revocation_seq (one counter row) and
// revocations (the feed).
const (
	// sqlTakeSeq takes the next $1 numbers of the feed and returns the
	// last one taken. The counter row's lock, held until the revoking
	// transaction ends, orders concurrent revokers in commit order.
	sqlTakeSeq = `UPDATE revocation_seq SET seq = seq + $1 WHERE id = 1 RETURNING seq`
	sqlInsert  = `INSERT INTO revocations (seq, kind, subject, tenant_id, node_id, at, reason, generation) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`

	entryColumns = `seq, kind, subject, tenant_id, node_id, at, reason, generation, body, signature, signer_cert`
	// sqlSince reads the entries after seq $1, in order, at most $2.
	sqlSince = `SELECT ` + entryColumns + ` FROM revocations WHERE seq > $1 ORDER BY seq LIMIT $2`
	// sqlForNode reads the newest $3 signed entries naming node $1 at or
	// after $2 (newest first; the caller puts them in feed order).
	sqlForNode = `SELECT ` + entryColumns + ` FROM revocations WHERE node_id = $1 AND at >= $2 AND signature IS NOT NULL ORDER BY seq DESC LIMIT $3`
	sqlHead    = `SELECT seq FROM revocation_seq WHERE id = 1`
	// sqlUnsigned reads the oldest $1 unsigned entries.
	sqlUnsigned = `SELECT ` + entryColumns + ` FROM revocations WHERE signature IS NULL ORDER BY seq LIMIT $1`
	// sqlSign stores an entry's signature unless another worker did first.
	sqlSign = `UPDATE revocations SET body = $1, signature = $2, signer_cert = $3 WHERE seq = $4 AND signature IS NULL`
	// sqlListTenant is sqlSince of tenant $3's entries.
	sqlListTenant = `SELECT ` + entryColumns + ` FROM revocations WHERE seq > $1 AND tenant_id = $3 ORDER BY seq LIMIT $2`
)
