package client

import (
	"context"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
)

// AuditEvent is one row of a tenant's audit log.
type AuditEvent = apitypes.AuditEvent

// AuditList is audit.list's answer.
type AuditList = apitypes.AuditList

// AuditProof is an event's inclusion proof (C2SP tlog-proof@v1 text).
type AuditProof = apitypes.AuditProof

// AuditList lists a tenant's audit events ("" for the caller's own
// tenant): sealed ones from seq since on, then unsealed ones; at most
// limit (0: the server's maximum).
func (c *Client) AuditList(ctx context.Context, tenant string, since int64, limit int) (AuditList, error) {
	var out AuditList
	err := c.Call(ctx, "audit.list", apitypes.AuditListIn{TenantID: tenant, Since: since, Limit: limit}, &out)
	return out, err
}

// AuditProve returns the inclusion proof of one event of a tenant's log
// ("" for the caller's own tenant).
func (c *Client) AuditProve(ctx context.Context, tenant, event string) (AuditProof, error) {
	var out AuditProof
	err := c.Call(ctx, "audit.prove", apitypes.AuditProveIn{TenantID: tenant, EventID: event}, &out)
	return out, err
}
