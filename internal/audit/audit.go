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
	// Credential is the API key or session id the caller presented (the
	// api envelope sets it). It is not written to the audit row: it lets
	// the revocation feed's follower find what a revoked credential still
	// holds open (tunnels.Service.CloseFor).
	Credential string
}

// Record writes e in tx, so that it commits or rolls back with its effect.
func Record(ctx context.Context, tx *sql.Tx, now time.Time, e Entry) error {
	details, err := json.Marshal(orEmpty(e.Details))
	if err != nil {
		return fmt.Errorf("audit: encode details: %w", err)
	}
	_, err = tx.ExecContext(ctx, qInsertEntry,
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
		q.WriteString(qInsertEntries)
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
	db      *store.DB
	clk     clock.Clock
	tenant  string // the tenant whose audit log records refusals
	refused *refusalLimiter
}

// Refusal rows written per (type, reason): a burst of RefusalBurst, then
// RefusalBurst per RefusalWindow.
const (
	RefusalBurst  = 20
	RefusalWindow = time.Minute
)

// NewEvents returns an event publisher that lets at most RefusalBurst rows
// per RefusalWindow through for each (type, reason) pair of refusals, and
// records each refusal it lets through in the audit log of tenant (the
// root tenant: package audit is below iam, so the caller names it).
func NewEvents(db *store.DB, clk clock.Clock, tenant string) *Events {
	return &Events{db: db, clk: clk, tenant: tenant, refused: newRefusalLimiter(RefusalBurst, RefusalWindow)}
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
	_, err = x.ExecContext(ctx, qInsertEvent,
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
	ok, suppressed := ev.refused.allow(typ+"\x00"+reason, ev.clk.Now())
	if !ok {
		return false, nil
	}
	d := map[string]any{"reason": reason}
	for k, v := range details {
		d[k] = v
	}
	if suppressed > 0 {
		d["suppressed_before"] = suppressed
	}
	// The refusal is also an audit row in the root tenant's log (ev.tenant),
	// so it is sealed and provable like any other event.
	actor := "anonymous"
	if nodeID != "" {
		actor = "node/" + nodeID
	}
	return true, ev.db.Tx(ctx, func(tx *sql.Tx) error {
		if err := ev.insert(ctx, tx, typ, nodeID, d); err != nil {
			return err
		}
		return Record(ctx, tx, ev.clk.Now(), Entry{TenantID: ev.tenant, Actor: actor, Action: typ, Resource: "node/" + nodeID, Outcome: "refused", Details: d})
	})
}

// List returns the events of typ (all types when empty), oldest first.
func (ev *Events) List(ctx context.Context, typ string) ([]Event, error) {
	q, args := qListEvents, []any(nil)
	if typ != "" {
		q, args = qListEventsOfType, []any{typ}
	}
	rows, err := ev.db.QueryContext(ctx, q+qEventsOrder, args...)
	if err != nil {
		return nil, fmt.Errorf("audit: list events: %w", err)
	}
	defer rows.Close()
	var out []Event
	for rows.Next() {
		e, err := scanEvent(rows)
		if err != nil {
			return nil, err
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
