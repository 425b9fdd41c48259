package api

import (
	"context"
	"time"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/quorum"
)

// BatchModules are the services behind the destructive-batch methods.
type BatchModules struct {
	Quorum   *quorum.Service
	Commands *commands.Service
}

// BatchMethods returns the methods (all decided in the root tenant, except
// a command in a batch, decided on its node) of the destructive-batch quorum:
// proposing, reading and approving batches, reading and changing the
// approver set, and queueing a command inside a batch. Approvals are
// signatures made off the control plane (`better-compute batch approve`);
// the server only checks and stores them, and nodes check them again.
func BatchMethods(m BatchModules) []Method {
	return heldBack(Modules{}, []Method{
		Def("batches.create", "compute:batches:create", true, func(apitypes.BatchCreateIn) Target { return Target{Tenant: iam.RootTenant} }, func(ctx context.Context, c *Caller, in apitypes.BatchCreateIn) (any, error) {
			// An agent's batch is recorded as its, for the person its
			// delegation names.
			var ag quorum.Agent
			if d, ok := AgentOf(ctx); ok {
				ag = quorum.Agent{Name: d.AgentName, For: d.PersonName}
			}
			return m.Quorum.Create(ctx, c.Actor(), ag, leafInputs(in.Leaves), time.Duration(in.ExpiresSeconds)*time.Second)
		}),
		Def("batches.get", "compute:batches:get", false, func(apitypes.IDIn) Target { return Target{Tenant: iam.RootTenant} }, func(ctx context.Context, c *Caller, in apitypes.IDIn) (any, error) {
			return m.Quorum.Get(ctx, c.Scope(), in.ID)
		}),
		Def("batches.list", "compute:batches:list", false, func(struct{}) Target { return Target{Tenant: iam.RootTenant} }, func(ctx context.Context, c *Caller, _ struct{}) (any, error) {
			bs, err := m.Quorum.List(ctx, c.Scope())
			if err != nil {
				return nil, err
			}
			return map[string]any{"batches": bs}, nil
		}),
		Def("batches.approve", "compute:batches:approve", true, func(apitypes.BatchApproveIn) Target { return Target{Tenant: iam.RootTenant} }, func(ctx context.Context, c *Caller, in apitypes.BatchApproveIn) (any, error) {
			if in.ID == "" || len(in.ApproverKey) == 0 || len(in.Signature) == 0 {
				return nil, errs.New(errs.InvalidInput, "id, approver_key and signature are required")
			}
			return m.Quorum.Approve(ctx, c.Actor(), in.ID, in.ApproverKey, in.Signature)
		}),
		Def("approvers.get", "compute:approvers:get", false, func(struct{}) Target { return Target{Tenant: iam.RootTenant} }, func(ctx context.Context, c *Caller, _ struct{}) (any, error) {
			return m.Quorum.CurrentView(ctx)
		}),
		Def("approvers.sign", "compute:approvers:sign", true, func(apitypes.ApproverSignIn) Target { return Target{Tenant: iam.RootTenant} }, func(ctx context.Context, c *Caller, in apitypes.ApproverSignIn) (any, error) {
			return m.Quorum.SignApproverSet(ctx, c.Actor(), in.Generation, in.Threshold, in.Keys, in.ApproverKey, in.Signature)
		}),
		Def("commands.createInBatch", "compute:commands:create", true, func(in apitypes.CommandInBatchIn) Target { return Target{Kind: "node", ID: in.NodeID} }, func(ctx context.Context, c *Caller, in apitypes.CommandInBatchIn) (any, error) {
			if in.NodeID == "" || in.Kind == "" || in.BatchID == "" {
				return nil, errs.New(errs.InvalidInput, "node_id, kind and batch_id are required")
			}
			return m.Commands.CreateInBatch(ctx, c.Actor(), in.NodeID, in.Kind, in.Payload, time.Duration(in.TTLSeconds)*time.Second, in.BatchID)
		}),
	})
}

// leafInputs converts the wire leaves to the quorum module's; the
// conversion compiles only while the two have the same fields.
func leafInputs(in []apitypes.LeafIn) []quorum.LeafInput {
	if in == nil {
		return nil
	}
	out := make([]quorum.LeafInput, len(in))
	for i, l := range in {
		out[i] = quorum.LeafInput(l)
	}
	return out
}
