package quorum

import (
	"context"
	"crypto/ed25519"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"time"

	"github.com/bettercompute/bettercompute/internal/quorum/quorumwire"
)

// The quorum module's SQL. It names only the tables the module owns:
// approver_sets, approver_set_signatures, batches, batch_approvals and
// batch_leaves.
const (
	// sqlInsertBatch records a proposed batch.
	sqlInsertBatch = `INSERT INTO batches (id, tenant_id, deployment, root, leaf_count, state, proposed_by, agent, agent_for, created_at, expires_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`

	// sqlInsertLeaf records one leaf of a batch.
	sqlInsertLeaf = `INSERT INTO batch_leaves (batch_id, idx, node_id, kind, unbound, payload_sha256, payload) VALUES ($1, $2, $3, $4, $5, $6, $7)`

	// sqlBatch reads a batch's row (scanBatch's columns).
	sqlBatch = `SELECT id, tenant_id, deployment, root, leaf_count, state, proposed_by, agent, agent_for, created_at, expires_at, approved_at
		FROM batches WHERE id = $1`

	// sqlLeaves reads a batch's leaves in order (scanLeaf's columns).
	sqlLeaves = `SELECT idx, node_id, kind, unbound, payload_sha256, payload FROM batch_leaves WHERE batch_id = $1 ORDER BY idx`

	// sqlApprovals reads a batch's approvals (scanApproval's columns).
	sqlApprovals = `SELECT approver_key, signature, submitted_by, created_at FROM batch_approvals WHERE batch_id = $1 ORDER BY created_at, approver_key`

	// sqlListBatchIDs and sqlListBatchIDsEnd surround the scope's filter on
	// tenant_id: the newest batches' ids, at most 100.
	sqlListBatchIDs    = `SELECT id FROM batches WHERE `
	sqlListBatchIDsEnd = ` ORDER BY created_at DESC, id LIMIT 100`

	// sqlInsertApproval records one approver's signature over a batch.
	sqlInsertApproval = `INSERT INTO batch_approvals (batch_id, approver_key, signature, submitted_by, created_at) VALUES ($1, $2, $3, $4, $5)`

	// sqlMarkApproved moves a proposed batch to approved.
	sqlMarkApproved = `UPDATE batches SET state = $1, approved_at = $2 WHERE id = $3 AND state = $4`

	// sqlBatchState reads a batch's state and expiry.
	sqlBatchState = `SELECT state, expires_at FROM batches WHERE id = $1`

	// sqlApproverSets reads the recorded approver-set changes, oldest first
	// (scanSetRow's columns).
	sqlApproverSets = `SELECT generation, threshold, keys, signatures FROM approver_sets ORDER BY generation`

	// sqlInsertSetSignature records one approver's signature over a new set.
	sqlInsertSetSignature = `INSERT INTO approver_set_signatures (generation, message, approver_key, signature, threshold, keys, submitted_by, created_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`

	// sqlSetSignatures reads the signatures over one proposed set.
	sqlSetSignatures = `SELECT approver_key, signature FROM approver_set_signatures WHERE generation = $1 AND message = $2 ORDER BY created_at`

	// sqlInsertApproverSet records an approver-set change its quorum signed.
	sqlInsertApproverSet = `INSERT INTO approver_sets (generation, deployment, threshold, keys, signatures, created_at) VALUES ($1, $2, $3, $4, $5, $6)`
)

// querier is a *store.DB or a *sql.Tx.
type querier interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}

// rowScanner is a *sql.Row or *sql.Rows.
type rowScanner interface {
	Scan(dest ...any) error
}

// batchRow is a batch as stored, with what the checks need beside the
// API's view.
type batchRow struct {
	Batch
	root        []byte
	expiresMS   int64
	leaves      []quorumwire.Leaf
	payloads    [][]byte
	approvals   []quorumwire.Signature
	leafCount   int
	approvedAtN sql.NullInt64
}

// scanBatch reads one row of sqlBatch, without leaves or approvals.
func scanBatch(row rowScanner) (*batchRow, error) {
	var r batchRow
	var created int64
	if err := row.Scan(&r.ID, &r.TenantID, &r.Deployment, &r.root, &r.leafCount, &r.State, &r.ProposedBy, &r.Agent, &r.AgentFor,
		&created, &r.expiresMS, &r.approvedAtN); err != nil {
		return nil, err
	}
	r.Root = hex.EncodeToString(r.root)
	r.CreatedAt, r.ExpiresAt, r.ExpiresMS = time.UnixMilli(created).UTC(), time.UnixMilli(r.expiresMS).UTC(), r.expiresMS
	if r.approvedAtN.Valid {
		t := time.UnixMilli(r.approvedAtN.Int64).UTC()
		r.ApprovedAt = &t
	}
	r.Proposer = proposerText(r.ProposedBy, r.Agent, r.AgentFor)
	r.Approvals, r.Leaves = []ApprovalView{}, []LeafView{}
	return &r, nil
}

// scanLeaf reads one row of sqlLeaves: the leaf, its payload as stored and
// its view.
func scanLeaf(row rowScanner) (quorumwire.Leaf, []byte, LeafView, error) {
	var v LeafView
	var unbound int
	var digest, payload []byte
	if err := row.Scan(&v.Index, &v.NodeID, &v.Kind, &unbound, &digest, &payload); err != nil {
		return quorumwire.Leaf{}, nil, LeafView{}, err
	}
	l := quorumwire.Leaf{NodeID: v.NodeID, Kind: v.Kind, Unbound: unbound != 0}
	copy(l.PayloadSHA256[:], digest)
	v.Unbound = l.Unbound
	if l.Unbound {
		v.Flag = UnboundFlag
	} else {
		v.PayloadSHA256 = hex.EncodeToString(digest)
		if len(payload) > 0 {
			v.Payload = json.RawMessage(payload)
		}
	}
	return l, payload, v, nil
}

// leafUnbound is a leaf's unbound column.
func leafUnbound(l quorumwire.Leaf) int {
	if l.Unbound {
		return 1
	}
	return 0
}

// scanApproval reads one row of sqlApprovals.
func scanApproval(row rowScanner) (quorumwire.Signature, ApprovalView, error) {
	var sig quorumwire.Signature
	var v ApprovalView
	var at int64
	if err := row.Scan(&sig.PublicKey, &sig.Signature, &v.SubmittedBy, &at); err != nil {
		return quorumwire.Signature{}, ApprovalView{}, err
	}
	v.ApproverKey = base64.StdEncoding.EncodeToString(sig.PublicKey)
	v.Signature = base64.StdEncoding.EncodeToString(sig.Signature)
	v.CreatedAt = time.UnixMilli(at).UTC()
	return sig, v, nil
}

// setRow is one recorded approver-set change.
type setRow struct {
	generation uint64
	threshold  int
	keys       [][]byte
	sigs       []quorumwire.Signature
}

// scanSetRow reads one row of sqlApproverSets. sigErr reports signatures
// that do not decode (the row is returned without them); err a failed scan.
func scanSetRow(row rowScanner) (r setRow, sigErr, err error) {
	var keys []byte
	var sigs string
	if err := row.Scan(&r.generation, &r.threshold, &keys, &sigs); err != nil {
		return setRow{}, nil, err
	}
	r.keys = splitKeys(keys)
	sigErr = json.Unmarshal([]byte(sigs), &r.sigs)
	return r, sigErr, nil
}

// splitKeys decodes a keys column: Ed25519 public keys end to end.
func splitKeys(b []byte) [][]byte {
	var out [][]byte
	for len(b) >= ed25519.PublicKeySize {
		out, b = append(out, b[:ed25519.PublicKeySize]), b[ed25519.PublicKeySize:]
	}
	return out
}
