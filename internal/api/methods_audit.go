package api

import (
	"context"
	"errors"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/auditlog"
	"github.com/bettercompute/bettercompute/internal/errs"
)

// AuditMethods read a tenant's tamper-evident audit log through the API:
// audit.list (compute:audit:list) and audit.prove (compute:audit:get).
// Both act in the tenant the input names, or the caller's own: the
// envelope's tenant pre-check keeps a tenant's admin to its own tenant and
// those below it, and every read is of that one tenant's log, so an event
// of another tenant answers NOT_FOUND exactly as a missing one does. Nil
// log: no methods.
func AuditMethods(l *auditlog.Log) []Method {
	if l == nil {
		return nil
	}
	return []Method{
		Def("audit.list", "compute:audit:list", false, byTenant[apitypes.AuditListIn],
			func(ctx context.Context, c *Caller, in apitypes.AuditListIn) (any, error) {
				limit := in.Limit
				if limit == 0 {
					limit = apitypes.MaxAuditList
				}
				evs, err := l.List(ctx, c.ActingTenant, in.Since, limit)
				if err != nil {
					return nil, err
				}
				out := apitypes.AuditList{Events: make([]apitypes.AuditEvent, len(evs))}
				for i, e := range evs {
					out.Events[i] = apitypes.AuditEvent(e)
				}
				return out, nil
			}),
		Def("audit.prove", "compute:audit:get", false, byTenant[apitypes.AuditProveIn],
			func(ctx context.Context, c *Caller, in apitypes.AuditProveIn) (any, error) {
				if in.EventID == "" {
					return nil, errs.New(errs.InvalidInput, "event_id is required")
				}
				p, err := l.Prove(ctx, c.ActingTenant, in.EventID)
				switch {
				case errors.Is(err, auditlog.ErrNotFound):
					return nil, errs.New(errs.NotFound, "event not found")
				case errors.Is(err, auditlog.ErrNotSealed):
					return nil, errs.New(errs.InvalidState, "event not sealed yet: the workers seal the log periodically, or an operator runs better-compute audit seal")
				case err != nil:
					return nil, err
				}
				return apitypes.AuditProof{TenantID: c.ActingTenant, EventID: in.EventID, Index: p.Index, Proof: string(p.Marshal())}, nil
			}),
	}
}
