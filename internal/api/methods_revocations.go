package api

import (
	"context"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
)

// revocationMethods are the revocation feed's methods: revocations.list
// (compute:revocations:list in the tenant the call acts in) answers
// {"revocations": [...]} in feed order, every entry to the root tenant and
// only its own entries to another tenant.
func revocationMethods(m Modules) []Method {
	if m.Revocations == nil {
		return nil
	}
	feed := m.Revocations
	return []Method{
		Def("revocations.list", "compute:revocations:list", false, byTenant[apitypes.RevocationsListIn],
			func(ctx context.Context, c *Caller, in apitypes.RevocationsListIn) (any, error) {
				limit := in.Limit
				if limit == 0 {
					limit = 100
				}
				scope := c.Scope()
				entries, err := feed.List(ctx, scope.Tenant, scope.Root(), in.Since, limit)
				if err != nil {
					return nil, err
				}
				out := make([]apitypes.Revocation, len(entries))
				for i, e := range entries {
					out[i] = apitypes.Revocation{Seq: e.Seq, Kind: e.Kind, Subject: e.Subject, TenantID: e.TenantID, NodeID: e.NodeID,
						At: e.At, Reason: e.Reason, Generation: e.Generation, Signed: e.Signed != nil}
				}
				return map[string]any{"revocations": out}, nil
			}),
	}
}
