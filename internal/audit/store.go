package audit

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/internal/store"
)

// The audit module owns the audit_events and events tables; this file
// holds every statement it runs on them and their row codecs. The audit
// log (package auditlog) numbers and reads audit rows through the
// functions below, never with its own SQL.

const (
	// eventCols are the audit_events columns an insert writes, in order.
	eventCols         = `id, tenant_id, at, actor, action, resource, outcome, request_id, caller, details`
	qInsertEntry      = `INSERT INTO audit_events (` + eventCols + `) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`
	qInsertEntries    = `INSERT INTO audit_events (` + eventCols + `) VALUES `
	qInsertEvent      = `INSERT INTO events (id, at, type, node_id, details) VALUES ($1, $2, $3, $4, $5)`
	qListEvents       = `SELECT id, at, type, node_id, details FROM events`
	qListEventsOfType = qListEvents + ` WHERE type = $1`
	qEventsOrder      = ` ORDER BY at, id`

	// rowCols are the audit_events columns every Row reader scans, in
	// scanRow's order.
	rowCols               = `seq, id, tenant_id, at, actor, action, resource, outcome, request_id, caller, details`
	qUnnumberedTenants    = `SELECT DISTINCT tenant_id FROM audit_events WHERE seq IS NULL ORDER BY tenant_id`
	qUnnumbered           = `SELECT ` + rowCols + ` FROM audit_events WHERE tenant_id = $1 AND seq IS NULL ORDER BY at, id LIMIT $2`
	qRowByID              = `SELECT ` + rowCols + ` FROM audit_events WHERE id = $1 AND tenant_id = $2`
	qRowsFrom             = `SELECT ` + rowCols + ` FROM audit_events WHERE tenant_id = $1 AND seq >= $2 ORDER BY seq LIMIT $3`
	qRowsBetween          = `SELECT ` + rowCols + ` FROM audit_events WHERE tenant_id = $1 AND seq >= $2 AND seq < $3 ORDER BY seq`
	qRowsBetweenLimit     = qRowsBetween + ` LIMIT $4`
	qCountStale           = `SELECT COUNT(*) FROM audit_events WHERE seq IS NULL AND at < $1`
	qOldestUnnumbered     = `SELECT MIN(at) FROM audit_events WHERE seq IS NULL`
	qNumberRow            = `UPDATE audit_events SET seq = $1 WHERE id = $2 AND seq IS NULL`
	qNumberRowsPrefix     = `WITH v(id, seq) AS (VALUES `
	qNumberRowsSuffix     = `) UPDATE audit_events SET seq = v.seq FROM v WHERE audit_events.id = v.id AND audit_events.seq IS NULL`
	numberChunk           = 1000
	numberRowsPlaceholder = "(CAST($%d AS TEXT), CAST($%d AS BIGINT))"
)

// Row is one audit row as the audit log reads it. Every field is covered
// by the log's leaf hash: an edit to any of them changes the leaf.
type Row struct {
	Seq       int64  `json:"seq"`
	ID        string `json:"id"`
	TenantID  string `json:"tenant"`
	At        int64  `json:"at_ms"` // unix milliseconds, as stored
	Actor     string `json:"actor"`
	Action    string `json:"action"`
	Resource  string `json:"resource"`
	Outcome   string `json:"outcome"`
	RequestID string `json:"request_id"`
	Caller    string `json:"caller"`
	Details   string `json:"details"` // the stored JSON text, byte for byte
}

// Querier is a *store.DB or a *sql.Tx: the audit row readers run in or
// out of a transaction.
type Querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

type scanner interface{ Scan(dest ...any) error }

// scanRow scans rowCols; an unnumbered row gets Seq -1.
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

// UnnumberedTenants returns the tenants that have rows without a sequence
// number (not yet sealed), in order.
func UnnumberedTenants(ctx context.Context, q Querier) ([]string, error) {
	rows, err := q.QueryContext(ctx, qUnnumberedTenants)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// Unnumbered returns up to limit of the tenant's rows without a sequence
// number, in the order (at, id).
func Unnumbered(ctx context.Context, q Querier, tenant string, limit int64) ([]Row, error) {
	return scanRows(q.QueryContext(ctx, qUnnumbered, tenant, limit))
}

// RowByID returns the tenant's row id; sql.ErrNoRows when absent.
func RowByID(ctx context.Context, q Querier, tenant, id string) (Row, error) {
	return scanRow(q.QueryRowContext(ctx, qRowByID, id, tenant))
}

// RowsFrom returns up to limit of the tenant's numbered rows with seq >=
// from, in seq order.
func RowsFrom(ctx context.Context, q Querier, tenant string, from, limit int64) ([]Row, error) {
	return scanRows(q.QueryContext(ctx, qRowsFrom, tenant, from, limit))
}

// RowsBetween returns the tenant's rows with lo <= seq < hi, in seq order:
// up to limit of them, or all when limit <= 0.
func RowsBetween(ctx context.Context, q Querier, tenant string, lo, hi, limit int64) ([]Row, error) {
	if limit <= 0 {
		return scanRows(q.QueryContext(ctx, qRowsBetween, tenant, lo, hi))
	}
	return scanRows(q.QueryContext(ctx, qRowsBetweenLimit, tenant, lo, hi, limit))
}

// UnnumberedAge counts the rows without a sequence number written before
// cutoff (unix ms), and returns the oldest such row's time (invalid when
// none).
func UnnumberedAge(ctx context.Context, q Querier, cutoff int64) (stale int64, oldest sql.NullInt64, err error) {
	if err := q.QueryRowContext(ctx, qCountStale, cutoff).Scan(&stale); err != nil {
		return 0, oldest, err
	}
	if err := q.QueryRowContext(ctx, qOldestUnnumbered).Scan(&oldest); err != nil {
		return 0, oldest, err
	}
	return stale, oldest, nil
}

// Number sets, inside tx, each row's stored sequence number to its Seq,
// refusing if any row was numbered meanwhile or vanished.
func Number(ctx context.Context, tx *sql.Tx, d store.Dialect, rows []Row) error {
	if d == store.SQLite {
		return numberEach(ctx, tx, rows)
	}
	for start := 0; start < len(rows); start += numberChunk {
		part := rows[start:min(start+numberChunk, len(rows))]
		var sb strings.Builder
		sb.WriteString(qNumberRowsPrefix)
		args := make([]any, 0, 2*len(part))
		for i, r := range part {
			if i > 0 {
				sb.WriteByte(',')
			}
			fmt.Fprintf(&sb, numberRowsPlaceholder, 2*i+1, 2*i+2)
			args = append(args, r.ID, r.Seq)
		}
		sb.WriteString(qNumberRowsSuffix)
		res, err := tx.ExecContext(ctx, sb.String(), args...)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n != int64(len(part)) {
			return fmt.Errorf("%d of %d rows updated (%v)", n, len(part), err)
		}
	}
	return nil
}

// numberEach is Number on in-process SQLite: one prepared point update per
// row is fastest (its planner would scan the table for UPDATE … FROM).
func numberEach(ctx context.Context, tx *sql.Tx, rows []Row) error {
	st, err := tx.PrepareContext(ctx, qNumberRow)
	if err != nil {
		return err
	}
	defer st.Close()
	for _, r := range rows {
		res, err := st.ExecContext(ctx, r.Seq, r.ID)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return fmt.Errorf("row %s not updated (%v)", r.ID, err)
		}
	}
	return nil
}

// scanEvent decodes a row of qListEvents.
func scanEvent(s scanner) (Event, error) {
	var e Event
	var at int64
	var details string
	if err := s.Scan(&e.ID, &at, &e.Type, &e.NodeID, &details); err != nil {
		return Event{}, fmt.Errorf("audit: scan event: %w", err)
	}
	e.At = time.UnixMilli(at).UTC()
	if err := json.Unmarshal([]byte(details), &e.Details); err != nil {
		return Event{}, fmt.Errorf("audit: decode event: %w", err)
	}
	return e, nil
}
