package auditlog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"

	"github.com/bettercompute/bettercompute/internal/audit"
)

// Prove returns the inclusion proof of one event in the tenant's latest
// checkpoint: three indexed reads (the row, the checkpoint, the O(log n)
// stored tree nodes). It checks the proof against the checkpoint's root
// before returning it and fails with ErrTampered when the database does not
// prove its own row.
func (l *Log) Prove(ctx context.Context, tenant, eventID string) (Proof, error) {
	r, err := audit.RowByID(ctx, l.db, tenant, eventID)
	if errors.Is(err, sql.ErrNoRows) {
		return Proof{}, fmt.Errorf("%w: %s in tenant %s", ErrNotFound, eventID, tenant)
	}
	if err != nil {
		return Proof{}, fmt.Errorf("auditlog: read event: %w", err)
	}
	if r.Seq < 0 {
		return Proof{}, fmt.Errorf("%w: %s", ErrNotSealed, eventID)
	}
	var size int64
	var msg []byte
	err = l.db.QueryRowContext(ctx, qCheckpointCovers, tenant, r.Seq).Scan(&size, &msg)
	if errors.Is(err, sql.ErrNoRows) {
		return Proof{}, fmt.Errorf("%w: no checkpoint covers seq %d", ErrNotSealed, r.Seq)
	}
	if err != nil {
		return Proof{}, fmt.Errorf("auditlog: read checkpoint: %w", err)
	}
	cp, err := checkpointBody(msg)
	if err != nil || cp.Size != uint64(size) {
		return Proof{}, fmt.Errorf("%w: checkpoint at size %d does not parse", ErrTampered, size)
	}
	pn, err := proof.Inclusion(uint64(r.Seq), cp.Size)
	if err != nil {
		return Proof{}, fmt.Errorf("auditlog: inclusion: %w", err)
	}
	hs, err := fetchNodes(ctx, l.db, tenant, pn.IDs)
	if err != nil {
		return Proof{}, err
	}
	path, err := pn.Rehash(hs, rfc6962.DefaultHasher.HashChildren)
	if err != nil {
		return Proof{}, fmt.Errorf("auditlog: inclusion: %w", err)
	}
	extra := EncodeRow(r)
	if err := proof.VerifyInclusion(rfc6962.DefaultHasher, uint64(r.Seq), cp.Size, rfc6962.DefaultHasher.HashLeaf(extra), path, cp.Root); err != nil {
		return Proof{}, fmt.Errorf("%w: event %s at seq %d: %v", ErrTampered, eventID, r.Seq, err)
	}
	return Proof{Extra: extra, Index: uint64(r.Seq), Hashes: path, Checkpoint: msg}, nil
}

// Event is one audit row as listed: its fields, its seq (nil until sealed)
// and whether a checkpoint covers it.
type Event struct {
	ID        string    `json:"id"`
	Seq       *int64    `json:"seq"`
	Sealed    bool      `json:"sealed"`
	At        time.Time `json:"at"`
	Actor     string    `json:"actor"`
	Action    string    `json:"action"`
	Resource  string    `json:"resource"`
	Outcome   string    `json:"outcome"`
	RequestID string    `json:"request_id"`
	Caller    string    `json:"caller"`
	Details   string    `json:"details"`
}

// List returns up to limit of the tenant's events: sealed rows with seq >=
// since in seq order, then (room permitting) rows not yet numbered, oldest
// first. limit <= 0 means no limit.
func (l *Log) List(ctx context.Context, tenant string, since int64, limit int) ([]Event, error) {
	var covered sql.NullInt64
	if err := l.db.QueryRowContext(ctx, qCheckpointMaxSize, tenant).Scan(&covered); err != nil {
		return nil, fmt.Errorf("auditlog: read checkpoints: %w", err)
	}
	lim := int64(limit)
	if limit <= 0 {
		lim = 1 << 62
	}
	numbered, err := audit.RowsFrom(ctx, l.db, tenant, since, lim)
	if err != nil {
		return nil, fmt.Errorf("auditlog: list: %w", err)
	}
	rest := lim - int64(len(numbered))
	var open []Row
	if rest > 0 {
		if open, err = audit.Unnumbered(ctx, l.db, tenant, rest); err != nil {
			return nil, fmt.Errorf("auditlog: list: %w", err)
		}
	}
	out := make([]Event, 0, len(numbered)+len(open))
	for _, r := range append(numbered, open...) {
		e := Event{ID: r.ID, At: time.UnixMilli(r.At).UTC(), Actor: r.Actor, Action: r.Action, Resource: r.Resource,
			Outcome: r.Outcome, RequestID: r.RequestID, Caller: r.Caller, Details: r.Details}
		if r.Seq >= 0 {
			e.Seq = i64(r.Seq)
			e.Sealed = covered.Valid && r.Seq < covered.Int64
		}
		out = append(out, e)
	}
	return out, nil
}
