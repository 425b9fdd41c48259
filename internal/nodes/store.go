package nodes

import (
	"crypto/x509"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/bettercompute/bettercompute/internal/quota"
)

// The SQL of the nodes module: it names only the tables the module owns
// (nodes, join_tokens, node_certs, node_sessions, session_flips).
const (
	sqlInsertToken = `INSERT INTO join_tokens (id, tenant_id, hash, role, name, created_by, created_at, expires_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`
	// sqlInsertTokensPrefix is followed by one value list per token.
	sqlInsertTokensPrefix = `INSERT INTO join_tokens (id, tenant_id, hash, role, name, created_by, created_at, expires_at) VALUES `
	// sqlDropUnusedTokensPrefix is followed by an id list and ")".
	sqlDropUnusedTokensPrefix = `DELETE FROM join_tokens WHERE used_at IS NULL AND id IN (`
	// sqlCountOutstandingTokens counts the unused, unexpired join tokens of
	// a top-level tenant ($1) and every tenant under it (at $2).
	sqlCountOutstandingTokens = `SELECT COUNT(*) FROM join_tokens WHERE ` + quota.InSubtree + ` AND used_at IS NULL AND expires_at > $2`
	sqlReadToken              = `SELECT hash, tenant_id, role, name, expires_at, used_at FROM join_tokens WHERE id = $1`
	sqlSpendToken             = `UPDATE join_tokens SET used_at = $1, node_id = $2 WHERE id = $3 AND used_at IS NULL`

	sqlInsertNode     = `INSERT INTO nodes (id, tenant_id, name, role, created_at) VALUES ($1, $2, $3, $4, $5)`
	sqlNodeTenant     = `SELECT tenant_id FROM nodes WHERE id = $1 AND deleted_at IS NULL`
	sqlLockNode       = `SELECT id FROM nodes WHERE id = $1 FOR UPDATE`
	sqlUpdateNodeSeen = `UPDATE nodes SET boot_id = $1, version = $2, labels = $3, inventory = $4, last_seen_at = $5 WHERE id = $6`
	sqlTouchNode      = `UPDATE nodes SET last_seen_at = $1 WHERE id = $2`
	// sqlNodeTenantsPrefix is followed by an id list and ")".
	sqlNodeTenantsPrefix = `SELECT id, tenant_id FROM nodes WHERE deleted_at IS NULL AND id IN (`

	sqlInsertCert = `INSERT INTO node_certs (serial, node_id, role, cert_der, not_before, not_after, created_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`
	sqlCertRevokedAt       = `SELECT revoked_at FROM node_certs WHERE serial = $1`
	sqlCountRecentRenewals = `SELECT COUNT(*) FROM node_certs WHERE node_id = $1 AND renewed_from IS NOT NULL AND created_at > $2`
	sqlChainRenewal        = `UPDATE node_certs SET renewed_from = $1 WHERE serial = $2`
	sqlSetAllowedKinds     = `UPDATE node_certs SET allowed_kinds = $1 WHERE serial = $2`
	sqlBumpHostGeneration  = `UPDATE nodes SET host_generation = host_generation + 1 WHERE id = (SELECT node_id FROM node_certs WHERE serial = $1)`
	// sqlHostSection reads a certificate's host section and its node's
	// generation in one statement, so the two are of one snapshot.
	sqlHostSection = `SELECT c.node_id, c.role, c.allowed_kinds, n.host_generation FROM node_certs c JOIN nodes n ON n.id = c.node_id
		WHERE c.serial = $1 AND c.revoked_at IS NULL AND n.deleted_at IS NULL`
	sqlCertState = `SELECT ` + certStateColumns + ` FROM node_certs WHERE serial = $1`
	// sqlCertStatesPrefix is followed by a serial list and ")".
	sqlCertStatesPrefix = `SELECT ` + certStateColumns + ` FROM node_certs WHERE serial IN (`
	sqlRevokeNodeCerts  = `UPDATE node_certs SET revoked_at = $1, revoke_reason = $2 WHERE revoked_at IS NULL AND node_id = $3`
	sqlRevokeNodeCert   = sqlRevokeNodeCerts + ` AND serial = $4`
	// The same revocations returning what they revoked, for the
	// revocation feed.
	sqlRevokeNodeCertsReturning = sqlRevokeNodeCerts + ` RETURNING serial, node_id`
	sqlRevokeNodeCertReturning  = sqlRevokeNodeCert + ` RETURNING serial, node_id`
	sqlRevokedSince             = `SELECT serial, revoked_at FROM node_certs WHERE revoked_at >= $1`
	sqlCertOfNode               = `SELECT n.tenant_id FROM node_certs c JOIN nodes n ON n.id = c.node_id WHERE c.serial = $1 AND c.node_id = $2`
	// sqlSupersedeOlderCerts revokes ($1 at, $2 reason) the node's ($3)
	// unrevoked certificates created no later than the one in use ($4).
	sqlSupersedeOlderCerts = `UPDATE node_certs SET revoked_at = $1, revoke_reason = $2
			WHERE node_id = $3 AND revoked_at IS NULL AND serial <> $4
			AND created_at <= (SELECT created_at FROM node_certs WHERE serial = $4)`
	sqlSupersedeOlderCertsReturning = sqlSupersedeOlderCerts + ` RETURNING serial, node_id`
	sqlActiveSerials                = `SELECT serial FROM node_certs WHERE node_id = $1 AND revoked_at IS NULL ORDER BY serial`
	sqlCountActiveCerts             = `SELECT COUNT(*) FROM node_certs WHERE node_id = $1 AND revoked_at IS NULL`
	sqlCertOwnerReason              = `SELECT node_id, revoke_reason FROM node_certs WHERE serial = $1`

	sqlReadSession = `SELECT session_id, boot_id, gateway_id, connected_at, closed_at, heartbeat_at FROM node_sessions WHERE node_id = $1`
	// sqlUpsertSession is the same text on both databases: "excluded" is
	// the proposed row in SQLite and, folded to lower case, in PostgreSQL.
	sqlUpsertSession = `INSERT INTO node_sessions (node_id, session_id, gateway_id, boot_id, cert_serial, connected_at, closed_at, heartbeat_at)
				VALUES ($1, $2, $3, $4, $5, $6, NULL, $6)
				ON CONFLICT (node_id) DO UPDATE SET session_id = excluded.session_id, gateway_id = excluded.gateway_id,
				boot_id = excluded.boot_id, cert_serial = excluded.cert_serial, connected_at = excluded.connected_at, closed_at = NULL,
				heartbeat_at = excluded.heartbeat_at`
	sqlSessionBoot          = `SELECT boot_id FROM node_sessions WHERE node_id = $1`
	sqlCloseNodeSessions    = `UPDATE node_sessions SET closed_at = $1 WHERE node_id = $2 AND closed_at IS NULL`
	sqlCloseSession         = `UPDATE node_sessions SET closed_at = $1 WHERE node_id = $2 AND session_id = $3 AND closed_at IS NULL`
	sqlCloseGatewaySessions = `UPDATE node_sessions SET closed_at = $1 WHERE gateway_id = $2 AND closed_at IS NULL`
	sqlHeartbeat            = `UPDATE node_sessions SET heartbeat_at = $1 WHERE gateway_id = $2 AND closed_at IS NULL`
	sqlSessionsMovedSince   = `SELECT node_id, session_id, connected_at FROM node_sessions WHERE connected_at >= $1 AND gateway_id <> $2`
	sqlInsertFlip           = `INSERT INTO session_flips (id, cert_serial, node_id, from_boot, to_boot, at) VALUES ($1, $2, $3, $4, $5, $6)`
	sqlCountFlips           = `SELECT COUNT(*) FROM session_flips WHERE node_id = $1 AND at > $2`
	sqlNodeByID             = nodeColumns + ` WHERE n.id = $1 AND n.deleted_at IS NULL`
	certStateColumns        = `serial, node_id, role, cert_der, not_after, revoked_at, allowed_kinds, revoke_reason`
	nodeColumns             = `SELECT n.id, n.name, n.tenant_id, n.role, n.boot_id, n.version, n.labels, n.inventory, n.created_at, n.last_seen_at,
		(SELECT COUNT(*) FROM node_sessions s WHERE s.node_id = n.id AND s.closed_at IS NULL),
		(SELECT MAX(c.not_after) FROM node_certs c WHERE c.node_id = n.id AND c.revoked_at IS NULL),
		(SELECT c.revoke_reason FROM node_certs c WHERE c.node_id = n.id AND c.revoked_at IS NOT NULL ORDER BY c.revoked_at DESC, c.serial LIMIT 1)
		FROM nodes n`
	// sqlLabeledNodes is what Labeled reads of each node.
	sqlLabeledNodes = `SELECT n.id, n.tenant_id, n.labels FROM nodes n`
)

// scanner is a row or rows being scanned.
type scanner interface{ Scan(...any) error }

// tokenRow is a join_tokens row as Join reads it.
type tokenRow struct {
	hash         []byte
	tenant, role string
	name         string
	expires      int64
	used         sql.NullInt64
}

func scanToken(row scanner) (tokenRow, error) {
	var t tokenRow
	err := row.Scan(&t.hash, &t.tenant, &t.role, &t.name, &t.expires, &t.used)
	return t, err
}

// sessionRow is a node_sessions row as OpenSession reads it.
type sessionRow struct {
	session, boot, gateway string
	connected              int64
	closed, heartbeat      sql.NullInt64
}

func scanSession(row scanner) (sessionRow, error) {
	var r sessionRow
	err := row.Scan(&r.session, &r.boot, &r.gateway, &r.connected, &r.closed, &r.heartbeat)
	return r, err
}

// scanNode decodes one row of nodeColumns; now derives the node's state.
func scanNode(row scanner, now time.Time) (Node, error) {
	var n Node
	var labels, inv string
	var created int64
	var seen, validUntil sql.NullInt64
	var live int
	var lastRevoke sql.NullString
	if err := row.Scan(&n.ID, &n.Name, &n.TenantID, &n.Role, &n.BootID, &n.Version, &labels, &inv, &created, &seen, &live, &validUntil, &lastRevoke); err != nil {
		return Node{}, fmt.Errorf("nodes: scan: %w", err)
	}
	n.Connected = live > 0
	n.State, n.StateReason = certState(now, validUntil, lastRevoke)
	n.CreatedAt = time.UnixMilli(created).UTC()
	if seen.Valid {
		t := time.UnixMilli(seen.Int64).UTC()
		n.LastSeenAt = &t
	}
	if err := json.Unmarshal([]byte(labels), &n.Labels); err != nil {
		return Node{}, fmt.Errorf("nodes: decode labels: %w", err)
	}
	n.Inventory = json.RawMessage(inv)
	return n, nil
}

// scanCertState decodes one row of certStateColumns.
func scanCertState(row interface{ Scan(...any) error }) (CertState, error) {
	var st CertState
	var der []byte
	var notAfter int64
	var revoked sql.NullInt64
	var allowed, reason sql.NullString
	if err := row.Scan(&st.Serial, &st.NodeID, &st.Role, &der, &notAfter, &revoked, &allowed, &reason); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return CertState{}, err
		}
		return CertState{}, fmt.Errorf("nodes: read cert: %w", err)
	}
	st.Revoked = revoked.Valid
	if st.Revoked {
		st.RevokeReason = reason.String
	}
	st.NotAfter = time.UnixMilli(notAfter)
	if allowed.Valid {
		if err := json.Unmarshal([]byte(allowed.String), &st.AllowedKinds); err != nil {
			return CertState{}, fmt.Errorf("nodes: decode allowed kinds: %w", err)
		}
		if st.AllowedKinds == nil {
			st.AllowedKinds = []string{}
		}
	}
	var err error
	if st.Cert, err = x509.ParseCertificate(der); err != nil {
		return CertState{}, fmt.Errorf("nodes: parse stored cert: %w: %w", errUnparsable, err)
	}
	return st, nil
}

// errUnparsable marks a stored certificate record that does not parse.
var errUnparsable = errors.New("unparsable certificate record")
