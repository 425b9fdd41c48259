package nodes

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/revocations"
	"github.com/bettercompute/bettercompute/internal/store"
)

// Session liveness across gateway processes: every gateway refreshes the
// heartbeat of the sessions it holds at least every SessionHeartbeat, and
// a session whose heartbeat is older than SessionQuietAfter went quiet (its
// gateway died or lost the database): a new Hello supersedes it without
// counting a flip.
const (
	SessionHeartbeat  = 10 * time.Second
	SessionQuietAfter = 3 * SessionHeartbeat
)

// Hello is what the gateway learned from a node's Hello and its certificate.
type Hello struct {
	NodeID    string
	BootID    string
	Serial    string
	SessionID string
	GatewayID string
	Version   string
	Labels    map[string]string
	Inventory json.RawMessage
}

// SessionOutcome tells the gateway what to do with a Hello.
type SessionOutcome struct {
	// Superseded is the session id this Hello replaced, when the node held
	// a session that was not closed (live or quiet, on any gateway).
	Superseded string
	// Quarantined means the node's certificates were revoked as a cloned
	// identity; the gateway must refuse the Hello (UNAUTHENTICATED).
	Quarantined bool
	// FlipCount is the node's running count of alternations in the window.
	FlipCount int
}

// lockNode serialises the session and renewal decisions of one node across
// gateway processes: a row lock on PostgreSQL; SQLite's immediate
// transactions on its single connection serialise them already.
func (s *Service) lockNode(ctx context.Context, tx *sql.Tx, nodeID string) error {
	if s.db.Dialect != store.Postgres {
		return nil
	}
	var id string
	if err := tx.QueryRowContext(ctx, sqlLockNode, nodeID).Scan(&id); err != nil {
		return fmt.Errorf("nodes: lock node: %w", err)
	}
	return nil
}

// OpenSession records a session for h.NodeID. The node's previous session,
// wherever it is held, is superseded (its gateway closes it: the same
// process at once, another within a revocation poll or at once on
// PostgreSQL NOTIFY). When that session was live (heartbeat within
// SessionQuietAfter) and from another boot, it is a flip of the node's
// identity: security.node.duplicate-session with both boot ids and the
// node's running count; more than FlipLimit flips within FlipWindow
// quarantine the node (every certificate of it revoked as
// duplicate-identity) and the Hello must be refused, which the revocation
// commit precedes. A Hello with a renewed certificate supersedes the
// node's older certificates (revoked as superseded).
func (s *Service) OpenSession(ctx context.Context, h Hello) (SessionOutcome, error) {
	now := s.clk.Now()
	var out SessionOutcome
	labels, err := json.Marshal(h.Labels)
	if err != nil {
		return out, fmt.Errorf("nodes: encode labels: %w", err)
	}
	if h.Labels == nil {
		labels = []byte("{}")
	}
	inv := string(h.Inventory)
	if inv == "" {
		inv = "{}"
	}
	var d sessionDecision
	var revoked bool
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		if err := s.lockNode(ctx, tx, h.NodeID); err != nil {
			return err
		}
		prev, err := scanSession(tx.QueryRowContext(ctx, sqlReadSession, h.NodeID))
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("nodes: read session: %w", err)
		}
		d = decideSession(prev, err == nil, h.BootID, h.GatewayID, now)
		out.Superseded = d.Superseded
		if d.Flip {
			out.FlipCount, out.Quarantined, err = s.flip(ctx, tx, now, h.NodeID, h.Serial, prev.boot, h.BootID, nil)
			if err != nil || out.Quarantined {
				return err
			}
		}
		revoked, err = writeSession(ctx, tx, h, string(labels), inv, now)
		return err
	})
	if err != nil {
		return SessionOutcome{}, err
	}
	if out.Quarantined || revoked {
		s.bus.Publish(bus.TopicRevoked)
	}
	if d.Moved {
		s.bus.Publish(bus.TopicSessions)
	}
	return out, nil
}

// writeSession records h as the node's session: the certificate in use
// supersedes every older one of the node (revoked reports whether any
// was), and the node row takes the Hello's boot, version, labels and
// inventory.
func writeSession(ctx context.Context, tx *sql.Tx, h Hello, labels, inv string, now time.Time) (revoked bool, err error) {
	feed, err := revokeCerts(ctx, tx, now, "", ReasonSuperseded, sqlSupersedeOlderCertsReturning,
		now.UnixMilli(), ReasonSuperseded, h.NodeID, h.Serial)
	if err != nil {
		return false, fmt.Errorf("nodes: supersede older certificates: %w", err)
	}
	revoked = len(feed) > 0
	if revoked {
		// Only a renewal's first Hello supersedes anything: the tenant is
		// read then, not on every session.
		tenant, err := nodeTenantTx(ctx, tx, h.NodeID)
		if err != nil {
			return false, err
		}
		for i := range feed {
			feed[i].TenantID = tenant
		}
	}
	if _, err := tx.ExecContext(ctx, sqlUpsertSession, h.NodeID, h.SessionID, h.GatewayID, h.BootID, h.Serial, now.UnixMilli()); err != nil {
		return false, fmt.Errorf("nodes: upsert session: %w", err)
	}
	if _, err := tx.ExecContext(ctx, sqlUpdateNodeSeen, h.BootID, h.Version, labels, inv, now.UnixMilli(), h.NodeID); err != nil {
		return false, fmt.Errorf("nodes: update node: %w", err)
	}
	// The superseded certificates' feed entries, the transaction's last
	// step (the feed's counter is taken last).
	return revoked, revocations.AppendTx(ctx, tx, feed...)
}

// flip records one alternation of nodeID's identity (the Hello's or the
// refused call's certificate serial, the boot ids when known) and counts
// the node's flips within FlipWindow, whatever certificate each used. Over
// FlipLimit it quarantines the node and reports so; otherwise it publishes
// security.node.duplicate-session.
func (s *Service) flip(ctx context.Context, tx *sql.Tx, now time.Time, nodeID, serial, fromBoot, toBoot string, extra map[string]any) (int, bool, error) {
	if _, err := tx.ExecContext(ctx, sqlInsertFlip,
		ids.New("fl_"), serial, nodeID, fromBoot, toBoot, now.UnixMilli()); err != nil {
		return 0, false, fmt.Errorf("nodes: record flip: %w", err)
	}
	var count int
	if err := tx.QueryRowContext(ctx, sqlCountFlips,
		nodeID, flipWindowStart(now).UnixMilli()).Scan(&count); err != nil {
		return 0, false, fmt.Errorf("nodes: count flips: %w", err)
	}
	details := map[string]any{"previous_boot_id": fromBoot, "boot_id": toBoot, "count": count, "serial": serial}
	for k, v := range extra {
		details[k] = v
	}
	if !quarantines(count) {
		return count, false, s.events.PublishTx(ctx, tx, EventDuplicateSession, nodeID, details)
	}
	if err := s.quarantine(ctx, tx, now, nodeID, details); err != nil {
		return count, false, err
	}
	return count, true, nil
}

// quarantine revokes every certificate of nodeID as duplicate-identity
// (each clone may hold a different one after renewals), closes its
// session, and records the event and the audit row.
func (s *Service) quarantine(ctx context.Context, tx *sql.Tx, now time.Time, nodeID string, details map[string]any) error {
	rows, err := tx.QueryContext(ctx, sqlActiveSerials, nodeID)
	if err != nil {
		return fmt.Errorf("nodes: read certificates to quarantine: %w", err)
	}
	var serials []string
	for rows.Next() {
		var serial string
		if err := rows.Scan(&serial); err != nil {
			rows.Close()
			return fmt.Errorf("nodes: read certificates to quarantine: %w", err)
		}
		serials = append(serials, serial)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("nodes: read certificates to quarantine: %w", err)
	}
	tenant, err := nodeTenantTx(ctx, tx, nodeID)
	if err != nil {
		return err
	}
	feed, err := revokeCerts(ctx, tx, now, tenant, ReasonDuplicateIdentity, sqlRevokeNodeCertsReturning,
		now.UnixMilli(), ReasonDuplicateIdentity, nodeID)
	if err != nil {
		return fmt.Errorf("nodes: quarantine: %w", err)
	}
	if _, err := tx.ExecContext(ctx, sqlCloseNodeSessions, now.UnixMilli(), nodeID); err != nil {
		return fmt.Errorf("nodes: close quarantined session: %w", err)
	}
	details["revoked_serials"] = serials
	if err := s.events.PublishTx(ctx, tx, EventQuarantined, nodeID, details); err != nil {
		return err
	}
	if err := audit.Record(ctx, tx, now, audit.Entry{TenantID: iam.RootTenant, Actor: "system", Action: "compute:nodes:quarantine",
		Resource: "node/" + nodeID, Outcome: "allowed", Details: details}); err != nil {
		return err
	}
	// The feed's counter last: the quarantine ends its transaction.
	return revocations.AppendTx(ctx, tx, feed...)
}

// nodeTenantTx reads nodeID's tenant inside tx.
func nodeTenantTx(ctx context.Context, tx *sql.Tx, nodeID string) (string, error) {
	var tenant string
	if err := tx.QueryRowContext(ctx, sqlNodeTenant, nodeID).Scan(&tenant); err != nil {
		return "", fmt.Errorf("nodes: read node tenant: %w", err)
	}
	return tenant, nil
}

// SupersededCertificateUsed records that a certificate revoked as
// superseded was presented again (to Renew or Session). The machine that
// renewed never goes back to its old certificate, so this is another holder
// of the node's identity: it counts as a flip of the node, toward
// quarantine. Nothing is counted once the node has no certificate left to
// protect. It reports whether the node is now quarantined.
func (s *Service) SupersededCertificateUsed(ctx context.Context, nodeID, serial string) (bool, error) {
	now := s.clk.Now()
	var quarantined bool
	err := s.db.Tx(ctx, func(tx *sql.Tx) error {
		if err := s.lockNode(ctx, tx, nodeID); err != nil {
			return err
		}
		var reason sql.NullString
		var owner string
		err := tx.QueryRowContext(ctx, sqlCertOwnerReason, serial).Scan(&owner, &reason)
		if err != nil || owner != nodeID || reason.String != ReasonSuperseded {
			return err
		}
		var active int
		if err := tx.QueryRowContext(ctx, sqlCountActiveCerts, nodeID).Scan(&active); err != nil {
			return fmt.Errorf("nodes: count certificates: %w", err)
		}
		if active == 0 {
			return nil
		}
		var boot string
		if err := tx.QueryRowContext(ctx, sqlSessionBoot, nodeID).Scan(&boot); err != nil && !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("nodes: read session: %w", err)
		}
		_, quarantined, err = s.flip(ctx, tx, now, nodeID, serial, boot, "", map[string]any{"reason": "superseded-certificate"})
		return err
	})
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if quarantined {
		s.bus.Publish(bus.TopicRevoked)
	}
	return quarantined, nil
}

// CloseSession marks sessionID closed if it is still the node's session.
func (s *Service) CloseSession(ctx context.Context, nodeID, sessionID string) error {
	now := s.clk.Now().UnixMilli()
	_, err := s.db.ExecContext(ctx, sqlCloseSession, now, nodeID, sessionID)
	if err != nil {
		return fmt.Errorf("nodes: close session: %w", err)
	}
	_, err = s.db.ExecContext(ctx, sqlTouchNode, now, nodeID)
	if err != nil {
		return fmt.Errorf("nodes: touch node: %w", err)
	}
	return nil
}

// CloseGatewaySessions marks every session of gatewayID closed (a gateway
// starting or stopping).
func (s *Service) CloseGatewaySessions(ctx context.Context, gatewayID string) error {
	_, err := s.db.ExecContext(ctx, sqlCloseGatewaySessions, s.clk.Now().UnixMilli(), gatewayID)
	if err != nil {
		return fmt.Errorf("nodes: close gateway sessions: %w", err)
	}
	return nil
}

// Heartbeat refreshes the heartbeat of every open session gatewayID holds
// (one statement per gateway per SessionHeartbeat).
func (s *Service) Heartbeat(ctx context.Context, gatewayID string) error {
	_, err := s.db.ExecContext(ctx, sqlHeartbeat, s.clk.Now().UnixMilli(), gatewayID)
	if err != nil {
		return fmt.Errorf("nodes: heartbeat: %w", err)
	}
	return nil
}

// SessionsMovedSince returns, for sessions opened at or after since on a
// gateway other than gatewayID, the node and its current session id, and
// the time to ask from next. A gateway holding another session of such a
// node closes it: the node's session is now elsewhere.
func (s *Service) SessionsMovedSince(ctx context.Context, gatewayID string, since time.Time) (map[string]string, time.Time, error) {
	rows, err := s.db.QueryContext(ctx, sqlSessionsMovedSince,
		since.UnixMilli(), gatewayID)
	if err != nil {
		return nil, since, fmt.Errorf("nodes: sessions moved: %w", err)
	}
	defer rows.Close()
	out := map[string]string{}
	next := since
	for rows.Next() {
		var node, session string
		var at int64
		if err := rows.Scan(&node, &session, &at); err != nil {
			return nil, since, fmt.Errorf("nodes: scan sessions moved: %w", err)
		}
		out[node] = session
		if t := time.UnixMilli(at); t.After(next) {
			next = t
		}
	}
	return out, next, rows.Err()
}
