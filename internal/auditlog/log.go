package auditlog

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"strconv"
	"strings"

	"github.com/transparency-dev/merkle/compact"
	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"
	"golang.org/x/mod/sumdb/note"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/store"
)

// DefaultSealBatch is the most rows one checkpoint adds by default. A seal
// of more rows writes several checkpoints, each in its own transaction, so
// that no transaction (and no lock on the tenant's log) grows without bound.
const DefaultSealBatch = 100_000

// Sentinel errors; test with errors.Is.
var (
	// ErrNotFound: no such event in the tenant.
	ErrNotFound = errors.New("auditlog: event not found")
	// ErrNotSealed: the event exists but no checkpoint covers it yet.
	ErrNotSealed = errors.New("auditlog: event not sealed yet")
	// ErrTampered: the stored log does not prove what it should; run verify.
	ErrTampered = errors.New("auditlog: the stored log does not match its signed checkpoint")
)

// Config configures a Log.
type Config struct {
	DB *store.DB
	// Deployment names the deployment in origins ("<deployment>/audit/<tenant>");
	// required to seal.
	Deployment string
	Clock      clock.Clock
	Log        *slog.Logger
	// SealBatch is the most rows one checkpoint adds (default DefaultSealBatch).
	SealBatch int
}

// Log seals, verifies, proves and lists the audit logs of every tenant in
// one database. It is safe for concurrent use and across processes: sealers
// of one tenant are serialised by a lock on the tenant's log-state row.
type Log struct {
	db         *store.DB
	deployment string
	clk        clock.Clock
	log        *slog.Logger
	batch      int
	rf         *compact.RangeFactory
}

// New returns a Log over c.DB.
func New(c Config) (*Log, error) {
	if c.DB == nil {
		return nil, errors.New("auditlog: a database is required")
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.SealBatch <= 0 {
		c.SealBatch = DefaultSealBatch
	}
	return &Log{db: c.DB, deployment: c.Deployment, clk: c.Clock, log: c.Log, batch: c.SealBatch,
		rf: &compact.RangeFactory{Hash: rfc6962.DefaultHasher.HashChildren}}, nil
}

// Deployment returns the deployment name in this log's origins.
func (l *Log) Deployment() string { return l.deployment }

// SigningKey is the audit key as the sealer uses it: a note signer, and the
// verifier of the same key, with which the sealer checks the last checkpoint
// before it extends a log.
type SigningKey struct {
	Signer   note.Signer
	Verifier note.Verifier
}

// NewSigningKey makes the sealer's key for deployment from the bundle's
// unsealed audit key (pki.Bundle.AuditSigningKey).
func NewSigningKey(deployment string, priv ed25519.PrivateKey) (*SigningKey, error) {
	s, err := NewSigner(deployment, priv)
	if err != nil {
		return nil, err
	}
	vkey, err := VerifierKey(deployment, priv.Public().(ed25519.PublicKey))
	if err != nil {
		return nil, err
	}
	v, err := note.NewVerifier(vkey)
	if err != nil {
		return nil, fmt.Errorf("auditlog: verifier: %w", err)
	}
	return &SigningKey{Signer: s, Verifier: v}, nil
}

// SealResult reports one checkpoint written by a seal.
type SealResult struct {
	Tenant string `json:"tenant"`
	Added  int    `json:"added"` // rows appended
	Size   int64  `json:"size"`  // the checkpoint's tree size
}

// SealAll seals every tenant that has unsealed rows (see Seal).
func (l *Log) SealAll(ctx context.Context, key *SigningKey) ([]SealResult, error) {
	rows, err := l.db.QueryContext(ctx, `SELECT DISTINCT tenant_id FROM audit_events WHERE seq IS NULL ORDER BY tenant_id`)
	if err != nil {
		return nil, fmt.Errorf("auditlog: list tenants: %w", err)
	}
	var tenants []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			rows.Close()
			return nil, fmt.Errorf("auditlog: list tenants: %w", err)
		}
		tenants = append(tenants, t)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("auditlog: list tenants: %w", err)
	}
	var out []SealResult
	for _, t := range tenants {
		res, err := l.Seal(ctx, t, key)
		out = append(out, res...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// Seal appends the tenant's committed, unsealed rows to its log and writes a
// signed checkpoint for each batch of at most SealBatch rows. Rows get
// dense sequence numbers continuing the log, in the order (at, id) among the
// rows committed since the last seal; a row whose transaction commits later
// gets a later number, so no row can land behind a sealed checkpoint.
func (l *Log) Seal(ctx context.Context, tenant string, key *SigningKey) ([]SealResult, error) {
	if l.deployment == "" || key == nil {
		return nil, errors.New("auditlog: sealing needs a deployment name and a signing key")
	}
	var out []SealResult
	for {
		res, err := l.sealBatch(ctx, tenant, key)
		if err != nil {
			return out, err
		}
		if res.Added == 0 {
			return out, nil
		}
		out = append(out, res)
		l.log.Info("audit log sealed", "tenant", tenant, "added", res.Added, "size", res.Size)
		if res.Added < l.batch {
			return out, nil
		}
	}
}

type nodeRec struct {
	level uint
	idx   uint64
	hash  []byte
	event string
}

func (l *Log) sealBatch(ctx context.Context, tenant string, key *SigningKey) (SealResult, error) {
	res := SealResult{Tenant: tenant}
	err := l.db.Tx(ctx, func(tx *sql.Tx) error {
		now := l.clk.Now().UnixMilli()
		if _, err := tx.ExecContext(ctx, `INSERT INTO audit_log_state (tenant_id, size, compact, updated_at) VALUES ($1, 0, $2, $3) ON CONFLICT (tenant_id) DO NOTHING`,
			tenant, []byte{}, now); err != nil {
			return fmt.Errorf("auditlog: log state: %w", err)
		}
		// The lock that serialises sealers of this tenant. SQLite's single
		// connection and immediate transactions serialise them already.
		q := `SELECT size, compact FROM audit_log_state WHERE tenant_id = $1`
		if l.db.Dialect == store.Postgres {
			q += ` FOR UPDATE`
		}
		var size int64
		var compactBlob []byte
		if err := tx.QueryRowContext(ctx, q, tenant).Scan(&size, &compactBlob); err != nil {
			return fmt.Errorf("auditlog: lock log state: %w", err)
		}
		rng, err := l.rangeFromBlob(uint64(size), compactBlob)
		if err != nil {
			return err
		}
		prevRoot, err := l.checkLastCheckpoint(ctx, tx, tenant, size, rng, key.Verifier)
		if err != nil {
			return err
		}
		batch, err := scanRows(tx.QueryContext(ctx, `SELECT `+rowCols+` FROM audit_events WHERE tenant_id = $1 AND seq IS NULL ORDER BY at, id LIMIT $2`, tenant, l.batch))
		if err != nil {
			return fmt.Errorf("auditlog: read unsealed rows: %w", err)
		}
		if len(batch) == 0 {
			return nil
		}
		nodes := make([]nodeRec, 0, 2*len(batch)+8)
		var events []string
		visit := func(id compact.NodeID, hash []byte) {
			n := nodeRec{level: id.Level, idx: id.Index, hash: hash}
			if id.Level == 0 {
				n.event = events[id.Index-uint64(size)]
			}
			nodes = append(nodes, n)
		}
		buf := make([]byte, 0, 512)
		for i := range batch {
			batch[i].Seq = size + int64(i)
			events = append(events, batch[i].ID)
			buf = AppendRow(buf[:0], batch[i])
			if err := rng.Append(rfc6962.DefaultHasher.HashLeaf(buf), visit); err != nil {
				return fmt.Errorf("auditlog: append: %w", err)
			}
		}
		if err := l.assignSeqs(ctx, tx, batch); err != nil {
			return err
		}
		if err := insertNodes(ctx, tx, l.db.Dialect, tenant, nodes); err != nil {
			return err
		}
		newSize := size + int64(len(batch))
		root, err := rng.GetRootHash(nil)
		if err != nil {
			return fmt.Errorf("auditlog: root: %w", err)
		}
		var cons [][]byte
		if size > 0 {
			pn, err := proof.Consistency(uint64(size), uint64(newSize))
			if err != nil {
				return fmt.Errorf("auditlog: consistency: %w", err)
			}
			hs, err := fetchNodes(ctx, tx, tenant, pn.IDs)
			if err != nil {
				return err
			}
			if cons, err = pn.Rehash(hs, rfc6962.DefaultHasher.HashChildren); err != nil {
				return fmt.Errorf("auditlog: consistency: %w", err)
			}
			if err := proof.VerifyConsistency(rfc6962.DefaultHasher, uint64(size), uint64(newSize), cons, prevRoot, root); err != nil {
				return fmt.Errorf("%w: consistency from size %d: %v", ErrTampered, size, err)
			}
		}
		msg, err := SignCheckpoint(Checkpoint{Origin: Origin(l.deployment, tenant), Size: uint64(newSize), Root: root}, key.Signer)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO audit_checkpoints (tenant_id, size, prev_size, note, consistency, created_at) VALUES ($1, $2, $3, $4, $5, $6)`,
			tenant, newSize, size, msg, bytes.Join(cons, nil), now); err != nil {
			return fmt.Errorf("auditlog: store checkpoint: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE audit_log_state SET size = $1, compact = $2, updated_at = $3 WHERE tenant_id = $4`,
			newSize, bytes.Join(rng.Hashes(), nil), now, tenant); err != nil {
			return fmt.Errorf("auditlog: update log state: %w", err)
		}
		res.Added, res.Size = len(batch), newSize
		return nil
	})
	if err != nil {
		return SealResult{Tenant: tenant}, err
	}
	return res, nil
}

// checkLastCheckpoint refuses to extend a log whose stored state does not
// hash to its last signed checkpoint: the sealer never signs on top of a
// tampered state. It returns the state's root (nil for an empty log).
func (l *Log) checkLastCheckpoint(ctx context.Context, tx *sql.Tx, tenant string, size int64, rng *compact.Range, v note.Verifier) ([]byte, error) {
	if size == 0 {
		return nil, nil
	}
	root, err := rng.GetRootHash(nil)
	if err != nil {
		return nil, fmt.Errorf("auditlog: root: %w", err)
	}
	var msg []byte
	err = tx.QueryRowContext(ctx, `SELECT note FROM audit_checkpoints WHERE tenant_id = $1 AND size = $2`, tenant, size).Scan(&msg)
	if err != nil {
		return nil, fmt.Errorf("%w: no checkpoint at the log's size %d: %v", ErrTampered, size, err)
	}
	cp, err := OpenCheckpoint(msg, v, Origin(l.deployment, tenant))
	if err != nil {
		return nil, fmt.Errorf("%w: checkpoint at size %d: %v", ErrTampered, size, err)
	}
	if cp.Size != uint64(size) || !bytes.Equal(cp.Root, root) {
		return nil, fmt.Errorf("%w: log state at size %d", ErrTampered, size)
	}
	return root, nil
}

func (l *Log) rangeFromBlob(size uint64, blob []byte) (*compact.Range, error) {
	if len(blob)%HashSize != 0 || len(blob)/HashSize != bits.OnesCount64(size) {
		return nil, fmt.Errorf("%w: log state holds %d bytes for size %d", ErrTampered, len(blob), size)
	}
	hashes := make([][]byte, 0, len(blob)/HashSize)
	for i := 0; i < len(blob); i += HashSize {
		hashes = append(hashes, blob[i:i+HashSize])
	}
	r, err := l.rf.NewRange(0, size, hashes)
	if err != nil {
		return nil, fmt.Errorf("auditlog: compact range: %w", err)
	}
	return r, nil
}

// storedRange loads the compact range [0, size) from the stored node hashes.
func (l *Log) storedRange(ctx context.Context, q queryer, tenant string, size uint64) (*compact.Range, error) {
	ids := compact.RangeNodes(0, size, nil)
	hs, err := fetchNodes(ctx, q, tenant, ids)
	if err != nil {
		return nil, err
	}
	return l.rf.NewRange(0, size, hs)
}

const seqChunk = 1000

// assignSeqs sets seq on each row of batch, refusing if any row was sealed
// meanwhile (which the lock makes impossible) or vanished.
func (l *Log) assignSeqs(ctx context.Context, tx *sql.Tx, batch []Row) error {
	if l.db.Dialect == store.SQLite {
		// In-process SQLite: one prepared point update per row is fastest
		// (its planner would scan the table for UPDATE … FROM).
		st, err := tx.PrepareContext(ctx, `UPDATE audit_events SET seq = $1 WHERE id = $2 AND seq IS NULL`)
		if err != nil {
			return fmt.Errorf("auditlog: assign seq: %w", err)
		}
		defer st.Close()
		for _, r := range batch {
			res, err := st.ExecContext(ctx, r.Seq, r.ID)
			if err != nil {
				return fmt.Errorf("auditlog: assign seq: %w", err)
			}
			if n, err := res.RowsAffected(); err != nil || n != 1 {
				return fmt.Errorf("auditlog: assign seq: row %s not updated (%v)", r.ID, err)
			}
		}
		return nil
	}
	for start := 0; start < len(batch); start += seqChunk {
		part := batch[start:min(start+seqChunk, len(batch))]
		var sb strings.Builder
		sb.WriteString(`WITH v(id, seq) AS (VALUES `)
		args := make([]any, 0, 2*len(part))
		for i, r := range part {
			if i > 0 {
				sb.WriteByte(',')
			}
			fmt.Fprintf(&sb, "(CAST($%d AS TEXT), CAST($%d AS BIGINT))", 2*i+1, 2*i+2)
			args = append(args, r.ID, r.Seq)
		}
		sb.WriteString(`) UPDATE audit_events SET seq = v.seq FROM v WHERE audit_events.id = v.id AND audit_events.seq IS NULL`)
		res, err := tx.ExecContext(ctx, sb.String(), args...)
		if err != nil {
			return fmt.Errorf("auditlog: assign seq: %w", err)
		}
		if n, err := res.RowsAffected(); err != nil || n != int64(len(part)) {
			return fmt.Errorf("auditlog: assign seq: %d of %d rows updated (%v)", n, len(part), err)
		}
	}
	return nil
}

const nodeChunk = 1000

func insertNodes(ctx context.Context, tx *sql.Tx, dialect store.Dialect, tenant string, nodes []nodeRec) error {
	if dialect == store.SQLite {
		// In-process SQLite: a prepared one-row insert is fastest (binding
		// $N names costs it time quadratic in a statement's parameters).
		st, err := tx.PrepareContext(ctx, `INSERT INTO audit_log_nodes (tenant_id, level, idx, hash, event_id) VALUES ($1, $2, $3, $4, $5)`)
		if err != nil {
			return fmt.Errorf("auditlog: store tree nodes: %w", err)
		}
		defer st.Close()
		for _, n := range nodes {
			if _, err := st.ExecContext(ctx, tenant, int64(n.level), int64(n.idx), n.hash, n.event); err != nil {
				return fmt.Errorf("auditlog: store tree nodes: %w", err)
			}
		}
		return nil
	}
	for start := 0; start < len(nodes); start += nodeChunk {
		part := nodes[start:min(start+nodeChunk, len(nodes))]
		var sb strings.Builder
		sb.WriteString(`INSERT INTO audit_log_nodes (tenant_id, level, idx, hash, event_id) VALUES `)
		args := make([]any, 0, 1+4*len(part))
		args = append(args, tenant)
		for i, n := range part {
			if i > 0 {
				sb.WriteByte(',')
			}
			b := 4*i + 2
			sb.WriteString("($1,$" + strconv.Itoa(b) + ",$" + strconv.Itoa(b+1) + ",$" + strconv.Itoa(b+2) + ",$" + strconv.Itoa(b+3) + ")")
			args = append(args, int64(n.level), int64(n.idx), n.hash, n.event)
		}
		if _, err := tx.ExecContext(ctx, sb.String(), args...); err != nil {
			return fmt.Errorf("auditlog: store tree nodes: %w", err)
		}
	}
	return nil
}

type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// fetchNodes reads the stored hashes of ids in one query, in the order of ids.
func fetchNodes(ctx context.Context, q queryer, tenant string, ids []compact.NodeID) ([][]byte, error) {
	if len(ids) == 0 {
		return [][]byte{}, nil
	}
	// One statement of primary-key point lookups: both planners use the
	// index for each arm, which they may not do for an OR of pairs.
	var sb strings.Builder
	args := []any{tenant}
	for i, id := range ids {
		if i > 0 {
			sb.WriteString(" UNION ALL ")
		}
		sb.WriteString("SELECT level, idx, hash FROM audit_log_nodes WHERE tenant_id = $1 AND level = $" + strconv.Itoa(2*i+2) + " AND idx = $" + strconv.Itoa(2*i+3))
		args = append(args, int64(id.Level), int64(id.Index))
	}
	rows, err := q.QueryContext(ctx, sb.String(), args...)
	if err != nil {
		return nil, fmt.Errorf("auditlog: read tree nodes: %w", err)
	}
	defer rows.Close()
	got := make(map[compact.NodeID][]byte, len(ids))
	for rows.Next() {
		var level, idx int64
		var h []byte
		if err := rows.Scan(&level, &idx, &h); err != nil {
			return nil, fmt.Errorf("auditlog: read tree nodes: %w", err)
		}
		got[compact.NewNodeID(uint(level), uint64(idx))] = h
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("auditlog: read tree nodes: %w", err)
	}
	out := make([][]byte, len(ids))
	for i, id := range ids {
		h, ok := got[id]
		if !ok || len(h) != HashSize {
			return nil, fmt.Errorf("%w: tree node (%d, %d) missing", ErrTampered, id.Level, id.Index)
		}
		out[i] = h
	}
	return out, nil
}

// rowCols are the audit_events columns every reader scans, in scanRow's order.
const rowCols = `seq, id, tenant_id, at, actor, action, resource, outcome, request_id, caller, details`

type scanner interface{ Scan(dest ...any) error }

// scanRow scans rowCols; an unsealed row gets Seq -1.
func scanRow(s scanner) (Row, error) {
	var r Row
	var seq sql.NullInt64
	if err := s.Scan(&seq, &r.ID, &r.TenantID, &r.At, &r.Actor, &r.Action, &r.Resource, &r.Outcome, &r.RequestID, &r.Caller, &r.Details); err != nil {
		return Row{}, err
	}
	r.Seq = -1
	if seq.Valid {
		r.Seq = seq.Int64
	}
	return r, nil
}

func scanRows(rows *sql.Rows, err error) ([]Row, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Row
	for rows.Next() {
		r, err := scanRow(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}
