package api

import (
	"context"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/errs"
)

// approvalMethods are delegations (an agent acting for a person) and the
// held-back requests of agents: listing and revoking delegations, the
// person's list of requests waiting for it, approving or denying one, and
// the command kinds a tenant holds back. A delegated agent may never call
// approvals.approve, approvals.deny or approvals.setKinds (confirm.go),
// and only the person an agent acts for may decide its requests.
func approvalMethods(m Modules) []Method {
	decideApproval := func(approve bool) func(context.Context, *Caller, apitypes.TenantIDIn) (any, error) {
		return func(ctx context.Context, c *Caller, in apitypes.TenantIDIn) (any, error) {
			if in.ID == "" {
				return nil, errs.New(errs.InvalidInput, "id is required")
			}
			return m.IAM.DecideApproval(ctx, c.Actor(), c.ActingTenant, in.ID, approve)
		}
	}
	return []Method{
		Def("delegations.list", "compute:delegations:list", false, byTenant[apitypes.TenantIn], func(ctx context.Context, c *Caller, _ apitypes.TenantIn) (any, error) {
			ds, err := m.IAM.ListDelegations(ctx, c.ActingTenant)
			if err != nil {
				return nil, err
			}
			return map[string]any{"delegations": ds}, nil
		}),
		Def("delegations.revoke", "compute:delegations:revoke", true, byTenant[apitypes.TenantIDIn], func(ctx context.Context, c *Caller, in apitypes.TenantIDIn) (any, error) {
			if in.ID == "" {
				return nil, errs.New(errs.InvalidInput, "id (the agent's identity) is required")
			}
			return map[string]any{}, m.IAM.RevokeDelegation(ctx, c.Actor(), c.ActingTenant, in.ID)
		}),
		Def("approvals.list", "compute:approvals:list", false, byTenant[apitypes.TenantIn], func(ctx context.Context, c *Caller, _ apitypes.TenantIn) (any, error) {
			as, err := m.IAM.PendingApprovals(ctx, c.ActingTenant, c.Identity)
			if err != nil {
				return nil, err
			}
			return map[string]any{"approvals": as}, nil
		}),
		Def("approvals.approve", "compute:approvals:approve", true, byTenant[apitypes.TenantIDIn], decideApproval(true)),
		Def("approvals.deny", "compute:approvals:deny", true, byTenant[apitypes.TenantIDIn], decideApproval(false)),
		Def("approvals.getKinds", "compute:approval-kinds:get", false, byTenant[apitypes.TenantIn], func(ctx context.Context, c *Caller, _ apitypes.TenantIn) (any, error) {
			ks, err := m.IAM.ConfirmKinds(ctx, c.ActingTenant)
			if err != nil {
				return nil, err
			}
			return map[string]any{"tenant_id": c.ActingTenant, "kinds": ks}, nil
		}),
		Def("approvals.setKinds", "compute:approval-kinds:set", true, byTenant[apitypes.ApprovalKindsIn], func(ctx context.Context, c *Caller, in apitypes.ApprovalKindsIn) (any, error) {
			ks, err := m.IAM.SetConfirmKinds(ctx, c.Actor(), c.ActingTenant, in.Kinds)
			if err != nil {
				return nil, err
			}
			return map[string]any{"tenant_id": c.ActingTenant, "kinds": ks}, nil
		}),
	}
}
