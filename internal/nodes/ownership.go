package nodes

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/errs"
)

// ErrNotNodeCert is the one answer for a serial that was never issued and
// for a serial of another node (INVALID_INPUT): a caller authorized for
// one node learns nothing about other nodes' certificates from it.
var ErrNotNodeCert = errs.New(errs.InvalidInput, "serial: not a certificate of this node")

// rowQuerier is what certOfNode reads through: the database or a
// transaction.
type rowQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// certOfNode checks that serial is a certificate of nodeID and returns the
// tenant that owns the node. Every method that names a node and one of its
// serials (nodes.revoke, nodes.restrict) authorizes the node and then
// applies this rule, so a serial never reaches another tenant's
// certificate.
func certOfNode(ctx context.Context, q rowQuerier, nodeID, serial string) (tenant string, err error) {
	err = q.QueryRowContext(ctx, sqlCertOfNode, serial, nodeID).Scan(&tenant)
	if errors.Is(err, sql.ErrNoRows) {
		return "", ErrNotNodeCert
	}
	if err != nil {
		return "", fmt.Errorf("nodes: read cert owner: %w", err)
	}
	return tenant, nil
}

// nodeTenant returns the tenant that owns nodeID; NOT_FOUND when unknown.
func nodeTenant(ctx context.Context, q rowQuerier, nodeID string) (string, error) {
	var t string
	err := q.QueryRowContext(ctx, sqlNodeTenant, nodeID).Scan(&t)
	if errors.Is(err, sql.ErrNoRows) {
		return "", errs.New(errs.NotFound, "node not found")
	}
	if err != nil {
		return "", fmt.Errorf("nodes: tenant of: %w", err)
	}
	return t, nil
}

// RestrictCert narrows the certificate serial of nodeID to kinds (nil
// removes the narrowing), after checking that serial belongs to nodeID
// (ErrNotNodeCert otherwise). The audit row is written in the tenant that
// owns the node.
func (s *Service) RestrictCert(ctx context.Context, actor audit.Entry, nodeID, serial string, kinds []string) error {
	tenant, err := certOfNode(ctx, s.db, nodeID, serial)
	if err != nil {
		return err
	}
	actor.TenantID = tenant
	return s.SetAllowedKinds(ctx, actor, serial, kinds)
}
