package nodes

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/revocations"
)

// The statements of join-token listing and revocation and of a tenant's
// teardown; they name only the module's tables.
const (
	sqlListTokens = `SELECT id, role, name, created_by, created_at, expires_at, used_at, node_id, revoked_at
		FROM join_tokens WHERE tenant_id = $1 ORDER BY created_at DESC, id LIMIT $2`
	// sqlRevokeToken revokes ($1 at) an unused, unrevoked token ($2) of a
	// tenant ($3), moving its expiry to the revocation when later.
	sqlRevokeToken = `UPDATE join_tokens SET revoked_at = $1, expires_at = CASE WHEN expires_at > $1 THEN $1 ELSE expires_at END
		WHERE id = $2 AND tenant_id = $3 AND used_at IS NULL AND revoked_at IS NULL`
	sqlRevokeTenantTokens = `UPDATE join_tokens SET revoked_at = $1, expires_at = CASE WHEN expires_at > $1 THEN $1 ELSE expires_at END
		WHERE tenant_id = $2 AND used_at IS NULL AND revoked_at IS NULL`
	sqlRevokeTenantCerts = `UPDATE node_certs SET revoked_at = $1, revoke_reason = $2
		WHERE revoked_at IS NULL AND node_id IN (SELECT id FROM nodes WHERE tenant_id = $3) RETURNING serial, node_id`
)

// ReasonTenantDeleted is the revocation reason of a deleted tenant's nodes.
const ReasonTenantDeleted = "tenant-deleted"

// MaxTokenList bounds a join-token listing.
const MaxTokenList = 1000

// Join-token states, as a listing shows them.
const (
	TokenOutstanding = "outstanding"
	TokenUsed        = "used"
	TokenExpired     = "expired"
	TokenRevoked     = "revoked"
)

// JoinToken is a join token's metadata; its secret is never stored.
type JoinToken struct {
	ID        string     `json:"id"`
	Role      string     `json:"role"`
	Name      string     `json:"name"`
	State     string     `json:"state"`
	CreatedBy string     `json:"created_by"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt time.Time  `json:"expires_at"`
	UsedAt    *time.Time `json:"used_at,omitempty"`
	NodeID    string     `json:"node_id,omitempty"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// tokenState is a token's state at now (unix ms).
func tokenState(used, revoked sql.NullInt64, expires, now int64) string {
	switch {
	case used.Valid:
		return TokenUsed
	case revoked.Valid:
		return TokenRevoked
	case expires <= now:
		return TokenExpired
	}
	return TokenOutstanding
}

// ListJoinTokens returns the newest join tokens of tenant (at most
// MaxTokenList), with their states.
func (s *Service) ListJoinTokens(ctx context.Context, tenant string) ([]JoinToken, error) {
	rows, err := s.db.QueryContext(ctx, sqlListTokens, tenant, MaxTokenList)
	if err != nil {
		return nil, fmt.Errorf("nodes: list tokens: %w", err)
	}
	defer rows.Close()
	now := s.clk.Now().UnixMilli()
	out := []JoinToken{}
	for rows.Next() {
		var t JoinToken
		var created, expires int64
		var used, revoked sql.NullInt64
		var node sql.NullString
		if err := rows.Scan(&t.ID, &t.Role, &t.Name, &t.CreatedBy, &created, &expires, &used, &node, &revoked); err != nil {
			return nil, fmt.Errorf("nodes: scan token: %w", err)
		}
		t.State = tokenState(used, revoked, expires, now)
		t.CreatedAt, t.ExpiresAt, t.NodeID = time.UnixMilli(created).UTC(), time.UnixMilli(expires).UTC(), node.String
		t.UsedAt, t.RevokedAt = msTime(used), msTime(revoked)
		out = append(out, t)
	}
	return out, rows.Err()
}

// msTime is a nullable unix-ms column as a UTC time.
func msTime(v sql.NullInt64) *time.Time {
	if !v.Valid {
		return nil
	}
	t := time.UnixMilli(v.Int64).UTC()
	return &t
}

// RevokeJoinToken revokes an unused join token of tenant, with its audit
// row: a node can no longer join with it. A token of another tenant, a
// used, revoked or unknown one answer NOT_FOUND alike.
func (s *Service) RevokeJoinToken(ctx context.Context, actor audit.Entry, tenant, id string) error {
	now := s.clk.Now()
	return s.db.Tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, sqlRevokeToken, now.UnixMilli(), id, tenant)
		if err != nil {
			return fmt.Errorf("nodes: revoke token: %w", err)
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return errs.New(errs.NotFound, "join token not found, used or already revoked")
		}
		actor.TenantID, actor.Action, actor.Resource, actor.Outcome = tenant, "compute:join-tokens:revoke", "join-token/"+id, "allowed"
		return audit.Record(ctx, tx, now, actor)
	})
}

// EndTenancy ends a deleted tenant's hold on machines: every certificate
// of its nodes is revoked (reason tenant-deleted; gateways close their
// sessions) and its unused join tokens are revoked, with one audit row in
// tenant, in one transaction. It returns the counts.
func (s *Service) EndTenancy(ctx context.Context, actor audit.Entry, tenant string) (certs, tokens int64, err error) {
	now := s.clk.Now()
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		feed, err := revokeCerts(ctx, tx, now, tenant, ReasonTenantDeleted, sqlRevokeTenantCerts, now.UnixMilli(), ReasonTenantDeleted, tenant)
		if err != nil {
			return fmt.Errorf("nodes: revoke tenant certificates: %w", err)
		}
		certs = int64(len(feed))
		res, err := tx.ExecContext(ctx, sqlRevokeTenantTokens, now.UnixMilli(), tenant)
		if err != nil {
			return fmt.Errorf("nodes: revoke tenant tokens: %w", err)
		}
		tokens, _ = res.RowsAffected()
		actor.TenantID, actor.Action, actor.Resource, actor.Outcome = tenant, "compute:tenants:delete", "tenant/"+tenant, "allowed"
		actor.Details = map[string]any{"step": "nodes", "certificates_revoked": certs, "join_tokens_revoked": tokens}
		if err := audit.Record(ctx, tx, now, actor); err != nil {
			return err
		}
		return revocations.AppendTx(ctx, tx, feed...)
	})
	if err == nil && certs > 0 {
		s.bus.Publish(bus.TopicRevoked)
	}
	return certs, tokens, err
}

// The statements of a node's deletion.
const (
	sqlDeleteNode = `UPDATE nodes SET deleted_at = $1 WHERE id = $2 AND deleted_at IS NULL`
)

// ReasonNodeDeleted is the revocation reason of a deleted node's
// certificates.
const ReasonNodeDeleted = "node-deleted"

// Delete removes a node from the fleet for good, with its audit row in the
// node's tenant, in one transaction: every certificate of it is revoked
// (every gateway closes its session, as for nodes.revoke), and no
// listing, lookup or command finds it again (NOT_FOUND, as a node that
// never was). Its row and certificates stay, so the commands it ran keep
// their attestations; a machine comes back only by joining anew.
func (s *Service) Delete(ctx context.Context, actor audit.Entry, nodeID string) (revoked int64, err error) {
	now := s.clk.Now()
	err = s.db.Tx(ctx, func(tx *sql.Tx) error {
		tenant, err := nodeTenant(ctx, tx, nodeID)
		if err != nil {
			return err
		}
		feed, err := revokeCerts(ctx, tx, now, tenant, ReasonNodeDeleted, sqlRevokeNodeCertsReturning, now.UnixMilli(), ReasonNodeDeleted, nodeID)
		if err != nil {
			return fmt.Errorf("nodes: delete: revoke: %w", err)
		}
		revoked = int64(len(feed))
		if _, err := tx.ExecContext(ctx, sqlDeleteNode, now.UnixMilli(), nodeID); err != nil {
			return fmt.Errorf("nodes: delete: %w", err)
		}
		actor.TenantID, actor.Action, actor.Resource, actor.Outcome = tenant, "compute:nodes:delete", "node/"+nodeID, "allowed"
		actor.Details = map[string]any{"certificates_revoked": revoked}
		if err := audit.Record(ctx, tx, now, actor); err != nil {
			return err
		}
		return revocations.AppendTx(ctx, tx, feed...)
	})
	if err == nil {
		s.bus.Publish(bus.TopicRevoked)
	}
	return revoked, err
}
