package api

import (
	"context"
	"encoding/json"
	"time"

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
	type createIn struct {
		Leaves         []quorum.LeafInput `json:"leaves" api:"items=4096"`
		ExpiresSeconds int64              `json:"expires_seconds" api:"min=0,max=604800"`
	}
	type idIn struct {
		ID string `json:"id" api:"max=64"`
	}
	type approveIn struct {
		ID          string `json:"id" api:"max=64"`
		ApproverKey []byte `json:"approver_key" api:"max=64"` // base64 Ed25519 public key
		Signature   []byte `json:"signature" api:"max=128"`   // base64
	}
	type signSetIn struct {
		Generation  uint64   `json:"generation" api:"min=1,max=9007199254740991"`
		Threshold   int      `json:"threshold" api:"min=1,max=32"`
		Keys        [][]byte `json:"keys" api:"items=32,max=64"` // base64 Ed25519 public keys
		ApproverKey []byte   `json:"approver_key" api:"max=64"`
		Signature   []byte   `json:"signature" api:"max=128"`
	}
	type runIn struct {
		NodeID     string          `json:"node_id" api:"max=64"`
		Kind       string          `json:"kind" api:"max=64"`
		Payload    json.RawMessage `json:"payload"`
		TTLSeconds int64           `json:"ttl_seconds" api:"min=0,max=86400"`
		BatchID    string          `json:"batch_id" api:"max=64"`
	}
	return []Method{
		Def("batches.create", "compute:batches:create", true, func(createIn) Target { return Target{Tenant: iam.RootTenant} }, func(ctx context.Context, c *Caller, in createIn) (any, error) {
			return m.Quorum.Create(ctx, c.Actor(), in.Leaves, time.Duration(in.ExpiresSeconds)*time.Second)
		}),
		Def("batches.get", "compute:batches:get", false, func(idIn) Target { return Target{Tenant: iam.RootTenant} }, func(ctx context.Context, c *Caller, in idIn) (any, error) {
			return m.Quorum.Get(ctx, c.ActingTenant, in.ID)
		}),
		Def("batches.list", "compute:batches:list", false, func(struct{}) Target { return Target{Tenant: iam.RootTenant} }, func(ctx context.Context, c *Caller, _ struct{}) (any, error) {
			bs, err := m.Quorum.List(ctx, c.ActingTenant)
			if err != nil {
				return nil, err
			}
			return map[string]any{"batches": bs}, nil
		}),
		Def("batches.approve", "compute:batches:approve", true, func(approveIn) Target { return Target{Tenant: iam.RootTenant} }, func(ctx context.Context, c *Caller, in approveIn) (any, error) {
			if in.ID == "" || len(in.ApproverKey) == 0 || len(in.Signature) == 0 {
				return nil, errs.New(errs.InvalidInput, "id, approver_key and signature are required")
			}
			return m.Quorum.Approve(ctx, c.Actor(), in.ID, in.ApproverKey, in.Signature)
		}),
		Def("approvers.get", "compute:approvers:get", false, func(struct{}) Target { return Target{Tenant: iam.RootTenant} }, func(ctx context.Context, c *Caller, _ struct{}) (any, error) {
			return m.Quorum.CurrentView(ctx)
		}),
		Def("approvers.sign", "compute:approvers:sign", true, func(signSetIn) Target { return Target{Tenant: iam.RootTenant} }, func(ctx context.Context, c *Caller, in signSetIn) (any, error) {
			return m.Quorum.SignApproverSet(ctx, c.Actor(), in.Generation, in.Threshold, in.Keys, in.ApproverKey, in.Signature)
		}),
		Def("commands.createInBatch", "compute:commands:create", true, func(in runIn) Target { return Target{Kind: "node", ID: in.NodeID} }, func(ctx context.Context, c *Caller, in runIn) (any, error) {
			if in.NodeID == "" || in.Kind == "" || in.BatchID == "" {
				return nil, errs.New(errs.InvalidInput, "node_id, kind and batch_id are required")
			}
			return m.Commands.CreateInBatch(ctx, c.Actor(), in.NodeID, in.Kind, in.Payload, time.Duration(in.TTLSeconds)*time.Second, in.BatchID)
		}),
	}
}
