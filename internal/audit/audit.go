// Package audit writes audit rows and security events.
//
// An audit row records an allowed mutation (or a refusal) and is written in
// the same transaction as the effect it records. A security event records
// something an operator should see (a refused join, a duplicate session);
// refusals are rate limited per (type, reason) so that a flood of bad
// requests cannot fill the database, and the number suppressed is carried
// on the next row that passes.
package audit

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/store"
)

// Entry is one audit row. Details must never hold a secret value: name its
// reference or hash it.
type Entry struct {
	TenantID  string
	Actor     string
	Action    string
	Resource  string
	Outcome   string
	RequestID string
	Caller    string
	Details   map[string]any
}

// Record writes e in tx, so that it commits or rolls back with its effect.
func Record(ctx context.Context, tx *sql.Tx, now time.Time, e Entry) error {
	details, err := json.Marshal(orEmpty(e.Details))
	if err != nil {
		return fmt.Errorf("audit: encode details: %w", err)
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO audit_events (id, tenant_id, at, actor, action, resource, outcome, request_id, caller, details)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
		ids.New("ev_"), e.TenantID, now.UnixMilli(), e.Actor, e.Action, e.Resource, e.Outcome, e.RequestID, e.Caller, string(details))
	if err != nil {
		return fmt.Errorf("audit: insert: %w", err)
	}
	return nil
}

// RecordMany writes entries in tx like Record, with one multi-row INSERT
// per chunk instead of one statement per row (a 10,000-node fan-out writes
// 10,000 rows).
func RecordMany(ctx context.Context, tx *sql.Tx, d store.Dialect, now time.Time, entries []Entry) error {
	const perStmt = 500
	for chunk := range slices.Chunk(entries, perStmt) {
		a := store.NewArgsFor(d)
		var q strings.Builder
		q.WriteString(`INSERT INTO audit_events (id, tenant_id, at, actor, action, resource, outcome, request_id, caller, details) VALUES `)
		for i, e := range chunk {
			details, err := json.Marshal(orEmpty(e.Details))
			if err != nil {
				return fmt.Errorf("audit: encode details: %w", err)
			}
			if i > 0 {
				q.WriteString(", ")
			}
			q.WriteString("(" + a.List(ids.New("ev_"), e.TenantID, now.UnixMilli(), e.Actor, e.Action, e.Resource, e.Outcome, e.RequestID, e.Caller, string(details)) + ")")
		}
		if _, err := tx.ExecContext(ctx, q.String(), a.Values()...); err != nil {
			return fmt.Errorf("audit: insert: %w", err)
		}
	}
	return nil
}

// Event is one security event as read back.
type Event struct {
	ID      string         `json:"id"`
	At      time.Time      `json:"at"`
	Type    string         `json:"type"`
	NodeID  string         `json:"node_id,omitempty"`
	Details map[string]any `json:"details"`
}

// Events publishes and reads security events.
type Events struct {
	db    *store.DB
	clk   clock.Clock
	limit int           // rows per window per (type, reason)
	win   time.Duration // the window

	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	start      time.Time
	n          int
	suppressed int
}

// NewEvents returns an event publisher that lets at most 20 rows per minute
// through for each (type, reason) pair of refusals.
func NewEvents(db *store.DB, clk clock.Clock) *Events {
	return &Events{db: db, clk: clk, limit: 20, win: time.Minute, buckets: map[string]*bucket{}}
}

// Publish writes an event unconditionally (for facts that are not floods:
// a quarantine, a duplicate session).
func (ev *Events) Publish(ctx context.Context, typ, nodeID string, details map[string]any) error {
	return ev.insert(ctx, ev.db.DB, typ, nodeID, details)
}

// PublishTx writes an event inside tx.
func (ev *Events) PublishTx(ctx context.Context, tx *sql.Tx, typ, nodeID string, details map[string]any) error {
	return ev.insert(ctx, tx, typ, nodeID, details)
}

type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

func (ev *Events) insert(ctx context.Context, x execer, typ, nodeID string, details map[string]any) error {
	b, err := json.Marshal(orEmpty(details))
	if err != nil {
		return fmt.Errorf("audit: encode event: %w", err)
	}
	_, err = x.ExecContext(ctx, `INSERT INTO events (id, at, type, node_id, details) VALUES ($1, $2, $3, $4, $5)`,
		ids.New("se_"), ev.clk.Now().UnixMilli(), typ, nodeID, string(b))
	if err != nil {
		return fmt.Errorf("audit: insert event: %w", err)
	}
	return nil
}

// Refused records a refusal of type typ with its reason, rate limited per
// (typ, reason). It reports whether a row was written. Errors are returned
// for the caller to log; a refusal stands whether or not it was recorded.
func (ev *Events) Refused(ctx context.Context, typ, reason, nodeID string, details map[string]any) (bool, error) {
	key := typ + "\x00" + reason
	now := ev.clk.Now()
	ev.mu.Lock()
	b := ev.buckets[key]
	if b == nil || now.Sub(b.start) >= ev.win || now.Before(b.start) {
		prev := 0
		if b != nil {
			prev = b.suppressed
		}
		b = &bucket{start: now, suppressed: prev}
		ev.buckets[key] = b
	}
	if b.n >= ev.limit {
		b.suppressed++
		ev.mu.Unlock()
		return false, nil
	}
	b.n++
	suppressed := b.suppressed
	b.suppressed = 0
	ev.mu.Unlock()
	d := map[string]any{"reason": reason}
	for k, v := range details {
		d[k] = v
	}
	if suppressed > 0 {
		d["suppressed_before"] = suppressed
	}
	// The refusal is also an audit row in the root tenant's log, so it is
	// sealed and provable like any other event.
	actor := "anonymous"
	if nodeID != "" {
		actor = "node/" + nodeID
	}
	return true, ev.db.Tx(ctx, func(tx *sql.Tx) error {
		if err := ev.insert(ctx, tx, typ, nodeID, d); err != nil {
			return err
		}
		return Record(ctx, tx, ev.clk.Now(), Entry{TenantID: "root", Actor: actor, Action: typ, Resource: "node/" + nodeID, Outcome: "refused", Details: d})
	})
}

// List returns the events of typ (all types when empty), oldest first.
func (ev *Events) List(ctx context.Context, typ string) ([]Event, error) {
	q := `SELECT id, at, type, node_id, details FROM events`
	var args []any
	if typ != "" {
		q += ` WHERE type = $1`
		args = append(args, typ)
	}
	q += ` ORDER BY at, id`
	rows, err := ev.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("audit: list events: %w", err)
	}
	defer rows.Close()
	var out []Event
	for rows.Next() {
		var e Event
		var at int64
		var details string
		if err := rows.Scan(&e.ID, &at, &e.Type, &e.NodeID, &details); err != nil {
			return nil, fmt.Errorf("audit: scan event: %w", err)
		}
		e.At = time.UnixMilli(at).UTC()
		if err := json.Unmarshal([]byte(details), &e.Details); err != nil {
			return nil, fmt.Errorf("audit: decode event: %w", err)
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

func orEmpty(m map[string]any) map[string]any {
	if m == nil {
		return map[string]any{}
	}
	return m
}
