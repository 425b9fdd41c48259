package nodes

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/ids"
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
	// Superseded is the session id this Hello replaced, when another boot
	// held a live session for the node.
	Superseded string
	// Quarantined means the certificate was revoked as a cloned identity;
	// the gateway must refuse the Hello (UNAUTHENTICATED).
	Quarantined bool
	// FlipCount is the running count of alternations in the window.
	FlipCount int
}

// OpenSession records a session for h.NodeID. A live session from another
// boot is superseded (security.node.duplicate-session, with both boot ids
// and the running count); a certificate that alternated between boots more
// than FlipLimit times within FlipWindow is revoked as duplicate-identity
// and the Hello must be refused, which the revocation commit precedes.
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
	var dupDetails map[string]any
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		var prevSession, prevBoot string
		var closed sql.NullInt64
		err := tx.QueryRowContext(ctx, `SELECT session_id, boot_id, closed_at FROM node_sessions WHERE node_id = $1`, h.NodeID).
			Scan(&prevSession, &prevBoot, &closed)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("nodes: read session: %w", err)
		}
		live := err == nil && !closed.Valid
		if live && prevBoot != h.BootID {
			out.Superseded = prevSession
			if _, err := tx.ExecContext(ctx, `INSERT INTO session_flips (id, cert_serial, node_id, from_boot, to_boot, at) VALUES ($1, $2, $3, $4, $5, $6)`,
				ids.New("fl_"), h.Serial, h.NodeID, prevBoot, h.BootID, now.UnixMilli()); err != nil {
				return fmt.Errorf("nodes: record flip: %w", err)
			}
			if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM session_flips WHERE cert_serial = $1 AND at > $2`,
				h.Serial, now.Add(-FlipWindow).UnixMilli()).Scan(&out.FlipCount); err != nil {
				return fmt.Errorf("nodes: count flips: %w", err)
			}
			dupDetails = map[string]any{"previous_boot_id": prevBoot, "boot_id": h.BootID, "count": out.FlipCount, "serial": h.Serial}
			if out.FlipCount > FlipLimit {
				out.Quarantined = true
				if _, err := tx.ExecContext(ctx, `UPDATE node_certs SET revoked_at = $1, revoke_reason = $2 WHERE serial = $3 AND revoked_at IS NULL`,
					now.UnixMilli(), ReasonDuplicateIdentity, h.Serial); err != nil {
					return fmt.Errorf("nodes: quarantine: %w", err)
				}
				if _, err := tx.ExecContext(ctx, `UPDATE node_sessions SET closed_at = $1 WHERE node_id = $2`, now.UnixMilli(), h.NodeID); err != nil {
					return fmt.Errorf("nodes: close quarantined session: %w", err)
				}
				if err := s.events.PublishTx(ctx, tx, EventQuarantined, h.NodeID, dupDetails); err != nil {
					return err
				}
				return audit.Record(ctx, tx, now, audit.Entry{TenantID: "root", Actor: "system", Action: "compute:nodes:quarantine",
					Resource: "node/" + h.NodeID, Outcome: "allowed", Details: dupDetails})
			}
			if err := s.events.PublishTx(ctx, tx, EventDuplicateSession, h.NodeID, dupDetails); err != nil {
				return err
			}
		}
		if s.db.Dialect == "postgres" {
			_, err = tx.ExecContext(ctx, `INSERT INTO node_sessions (node_id, session_id, gateway_id, boot_id, cert_serial, connected_at, closed_at)
				VALUES ($1, $2, $3, $4, $5, $6, NULL)
				ON CONFLICT (node_id) DO UPDATE SET session_id = EXCLUDED.session_id, gateway_id = EXCLUDED.gateway_id,
				boot_id = EXCLUDED.boot_id, cert_serial = EXCLUDED.cert_serial, connected_at = EXCLUDED.connected_at, closed_at = NULL`,
				h.NodeID, h.SessionID, h.GatewayID, h.BootID, h.Serial, now.UnixMilli())
		} else {
			_, err = tx.ExecContext(ctx, `INSERT INTO node_sessions (node_id, session_id, gateway_id, boot_id, cert_serial, connected_at, closed_at)
				VALUES ($1, $2, $3, $4, $5, $6, NULL)
				ON CONFLICT (node_id) DO UPDATE SET session_id = excluded.session_id, gateway_id = excluded.gateway_id,
				boot_id = excluded.boot_id, cert_serial = excluded.cert_serial, connected_at = excluded.connected_at, closed_at = NULL`,
				h.NodeID, h.SessionID, h.GatewayID, h.BootID, h.Serial, now.UnixMilli())
		}
		if err != nil {
			return fmt.Errorf("nodes: upsert session: %w", err)
		}
		_, err = tx.ExecContext(ctx, `UPDATE nodes SET boot_id = $1, version = $2, labels = $3, inventory = $4, last_seen_at = $5 WHERE id = $6`,
			h.BootID, h.Version, string(labels), inv, now.UnixMilli(), h.NodeID)
		if err != nil {
			return fmt.Errorf("nodes: update node: %w", err)
		}
		return nil
	})
	if err != nil {
		return SessionOutcome{}, err
	}
	if out.Quarantined {
		s.bus.Publish(bus.TopicRevoked)
	}
	return out, nil
}

// CloseSession marks sessionID closed if it is still the node's session.
func (s *Service) CloseSession(ctx context.Context, nodeID, sessionID string) error {
	now := s.clk.Now().UnixMilli()
	_, err := s.db.ExecContext(ctx, `UPDATE node_sessions SET closed_at = $1 WHERE node_id = $2 AND session_id = $3 AND closed_at IS NULL`, now, nodeID, sessionID)
	if err != nil {
		return fmt.Errorf("nodes: close session: %w", err)
	}
	_, err = s.db.ExecContext(ctx, `UPDATE nodes SET last_seen_at = $1 WHERE id = $2`, now, nodeID)
	if err != nil {
		return fmt.Errorf("nodes: touch node: %w", err)
	}
	return nil
}

// CloseGatewaySessions marks every session of gatewayID closed (a gateway
// starting or stopping).
func (s *Service) CloseGatewaySessions(ctx context.Context, gatewayID string) error {
	_, err := s.db.ExecContext(ctx, `UPDATE node_sessions SET closed_at = $1 WHERE gateway_id = $2 AND closed_at IS NULL`, s.clk.Now().UnixMilli(), gatewayID)
	if err != nil {
		return fmt.Errorf("nodes: close gateway sessions: %w", err)
	}
	return nil
}
