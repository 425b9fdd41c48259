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

	"github.com/transparency-dev/merkle/compact"
	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"
	"golang.org/x/mod/sumdb/note"

	"github.com/bettercompute/bettercompute/internal/audit"
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
	tenants, err := audit.UnnumberedTenants(ctx, l.db)
	if err != nil {
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

// sealBatch appends up to SealBatch of the tenant's unsealed rows to its
// log in one transaction: it reads and locks the log's state and checks it
// against the last checkpoint, computes the new tree (appendRows), and
// writes the rows' numbers, the tree's nodes, the signed checkpoint and the
// new state.
func (l *Log) sealBatch(ctx context.Context, tenant string, key *SigningKey) (SealResult, error) {
	res := SealResult{Tenant: tenant}
	err := l.db.Tx(ctx, func(tx *sql.Tx) error {
		now := l.clk.Now().UnixMilli()
		size, rng, prevRoot, err := l.openState(ctx, tx, tenant, now, key.Verifier)
		if err != nil {
			return err
		}
		batch, err := audit.Unnumbered(ctx, tx, tenant, int64(l.batch))
		if err != nil {
			return fmt.Errorf("auditlog: read unsealed rows: %w", err)
		}
		if len(batch) == 0 {
			return nil
		}
		nodes, err := appendRows(rng, size, batch)
		if err != nil {
			return err
		}
		if err := audit.Number(ctx, tx, l.db.Dialect, batch); err != nil {
			return fmt.Errorf("auditlog: assign seq: %w", err)
		}
		if err := insertNodes(ctx, tx, l.db.Dialect, tenant, nodes); err != nil {
			return err
		}
		newSize := size + int64(len(batch))
		if err := l.writeCheckpoint(ctx, tx, tenant, key.Signer, size, newSize, rng, prevRoot, now); err != nil {
			return err
		}
		res.Added, res.Size = len(batch), newSize
		return nil
	})
	if err != nil {
		return SealResult{Tenant: tenant}, err
	}
	return res, nil
}

// openState creates the tenant's log state when missing, reads it under
// the lock that serialises the tenant's sealers, and checks it against the
// last checkpoint. It returns the log's size, its compact range and root
// (nil for an empty log).
func (l *Log) openState(ctx context.Context, tx *sql.Tx, tenant string, now int64, v note.Verifier) (int64, *compact.Range, []byte, error) {
	if _, err := tx.ExecContext(ctx, qInitState, tenant, []byte{}, now); err != nil {
		return 0, nil, nil, fmt.Errorf("auditlog: log state: %w", err)
	}
	// The lock that serialises sealers of this tenant. SQLite's single
	// connection and immediate transactions serialise them already.
	q := qState
	if l.db.Dialect == store.Postgres {
		q += qLockSuffix
	}
	var size int64
	var compactBlob []byte
	if err := tx.QueryRowContext(ctx, q, tenant).Scan(&size, &compactBlob); err != nil {
		return 0, nil, nil, fmt.Errorf("auditlog: lock log state: %w", err)
	}
	rng, err := l.rangeFromBlob(uint64(size), compactBlob)
	if err != nil {
		return 0, nil, nil, err
	}
	prevRoot, err := l.checkLastCheckpoint(ctx, tx, tenant, size, rng, v)
	if err != nil {
		return 0, nil, nil, err
	}
	return size, rng, prevRoot, nil
}

// appendRows numbers batch from size on (setting each row's Seq) and
// appends their leaves to rng, returning the tree nodes the append made
// (with the event of each leaf). It reads and writes nothing else.
func appendRows(rng *compact.Range, size int64, batch []Row) ([]nodeRec, error) {
	nodes := make([]nodeRec, 0, 2*len(batch)+8)
	visit := func(id compact.NodeID, hash []byte) {
		n := nodeRec{level: id.Level, idx: id.Index, hash: hash}
		if id.Level == 0 {
			n.event = batch[id.Index-uint64(size)].ID
		}
		nodes = append(nodes, n)
	}
	buf := make([]byte, 0, 512)
	for i := range batch {
		batch[i].Seq = size + int64(i)
		buf = AppendRow(buf[:0], batch[i])
		if err := rng.Append(rfc6962.DefaultHasher.HashLeaf(buf), visit); err != nil {
			return nil, fmt.Errorf("auditlog: append: %w", err)
		}
	}
	return nodes, nil
}

// writeCheckpoint proves the grown tree (newSize, rng) consistent with the
// previous one (size, prevRoot) from the stored nodes, signs its checkpoint
// and stores it with the log's new state.
func (l *Log) writeCheckpoint(ctx context.Context, tx *sql.Tx, tenant string, signer note.Signer, size, newSize int64, rng *compact.Range, prevRoot []byte, now int64) error {
	root, err := rng.GetRootHash(nil)
	if err != nil {
		return fmt.Errorf("auditlog: root: %w", err)
	}
	cons, err := l.consistency(ctx, tx, tenant, size, newSize, prevRoot, root)
	if err != nil {
		return err
	}
	msg, err := SignCheckpoint(Checkpoint{Origin: Origin(l.deployment, tenant), Size: uint64(newSize), Root: root}, signer)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, qInsertCheckpoint, tenant, newSize, size, msg, bytes.Join(cons, nil), now); err != nil {
		return fmt.Errorf("auditlog: store checkpoint: %w", err)
	}
	if _, err := tx.ExecContext(ctx, qUpdateState, newSize, bytes.Join(rng.Hashes(), nil), now, tenant); err != nil {
		return fmt.Errorf("auditlog: update log state: %w", err)
	}
	return nil
}

// consistency returns the consistency proof from size to newSize, built
// from the stored nodes inside tx and checked against both roots (none
// for an empty previous log).
func (l *Log) consistency(ctx context.Context, tx *sql.Tx, tenant string, size, newSize int64, prevRoot, root []byte) ([][]byte, error) {
	if size == 0 {
		return nil, nil
	}
	pn, err := proof.Consistency(uint64(size), uint64(newSize))
	if err != nil {
		return nil, fmt.Errorf("auditlog: consistency: %w", err)
	}
	hs, err := fetchNodes(ctx, tx, tenant, pn.IDs)
	if err != nil {
		return nil, err
	}
	cons, err := pn.Rehash(hs, rfc6962.DefaultHasher.HashChildren)
	if err != nil {
		return nil, fmt.Errorf("auditlog: consistency: %w", err)
	}
	if err := proof.VerifyConsistency(rfc6962.DefaultHasher, uint64(size), uint64(newSize), cons, prevRoot, root); err != nil {
		return nil, fmt.Errorf("%w: consistency from size %d: %v", ErrTampered, size, err)
	}
	return cons, nil
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
	err = tx.QueryRowContext(ctx, qCheckpointAt, tenant, size).Scan(&msg)
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
