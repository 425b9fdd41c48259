package nodes

import (
	"context"
	"database/sql"
	"fmt"
	"regexp"
	"strings"
	"unicode"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// Bounds on what a node's helper events may write: a node is trusted to
// relay its helper's log, not to fill the audit log, so a message carries
// at most MaxHelperEvents events and each string is cut.
const (
	MaxHelperEvents     = 256
	maxHelperEventField = 200
)

// RecordHelperEvents writes the node's root-helper events (bcd helper's
// operations done and callers or requests refused) as audit rows of the
// node's tenant, one per event, in one transaction: action
// compute:nodes:helper.<op> (compute:nodes:helper.refused for a refused
// caller that named no operation), outcome "allowed" or "refused", the
// caller's pid and uid and the refusal code in the details. The node
// relays what its helper logged; the rows say so (actor node/<id>).
// More than MaxHelperEvents events is refused whole, INVALID_INPUT-like,
// so a misbehaving node cannot flood the log.
func (s *Service) RecordHelperEvents(ctx context.Context, nodeID string, m *nodev1.HelperEvents) error {
	evs := m.GetEvents()
	if len(evs) > MaxHelperEvents {
		return fmt.Errorf("nodes: %d helper events in one message, at most %d", len(evs), MaxHelperEvents)
	}
	now := s.clk.Now()
	return s.db.Tx(ctx, func(tx *sql.Tx) error {
		var tenant string
		if err := tx.QueryRowContext(ctx, sqlNodeTenant, nodeID).Scan(&tenant); err != nil {
			return fmt.Errorf("nodes: read node: %w", err)
		}
		entries := make([]audit.Entry, 0, len(evs)+1)
		for _, e := range evs {
			entries = append(entries, helperEntry(tenant, nodeID, e))
		}
		if m.GetDropped() > 0 {
			entries = append(entries, audit.Entry{TenantID: tenant, Actor: "node/" + nodeID, Action: "compute:nodes:helper.dropped",
				Resource: "node/" + nodeID, Outcome: "refused", Details: map[string]any{"dropped": m.GetDropped()}})
		}
		if len(entries) == 0 {
			return nil
		}
		return audit.RecordMany(ctx, tx, s.db.Dialect, now, entries)
	})
}

// helperEntry is one helper event's audit row.
func helperEntry(tenant, nodeID string, e *nodev1.HelperEvent) audit.Entry {
	op := e.GetOp()
	switch {
	case op == "":
		op = "refused"
	case !opToken.MatchString(op):
		op = "other" // the action names a helper operation, never free text
	}
	outcome, details := "allowed", map[string]any{"pid": e.GetPid(), "uid": e.GetUid(), "helper_at_ms": e.GetAtMs()}
	if e.GetCode() != "" {
		outcome = "refused"
		details["code"] = clip(e.GetCode())
		details["reason"] = clip(e.GetReason())
	}
	return audit.Entry{TenantID: tenant, Actor: "node/" + nodeID, Action: "compute:nodes:helper." + op,
		Resource: "node/" + nodeID, Outcome: outcome, Details: details}
}

// opToken is the shape of a helper operation's name (sandbox.create).
var opToken = regexp.MustCompile(`^[a-z]{1,16}(\.[a-z]{1,16})?$`)

// clip keeps a node-given string printable and short.
func clip(s string) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return -1
		}
		return r
	}, s)
	if len(s) > maxHelperEventField {
		s = strings.ToValidUTF8(s[:maxHelperEventField], "")
	}
	return s
}
