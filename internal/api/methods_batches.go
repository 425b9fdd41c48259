package api

import (
	"context"
	"encoding/json"
	"time"

	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/quorum"
)

// BatchModules are the services behind the destructive-batch methods.
type BatchModules struct {
	Quorum   *quorum.Service
	Commands *commands.Service
}

// BatchMethods returns the methods of the destructive-batch quorum:
// proposing, reading and approving batches, reading and changing the
// approver set, and queueing a command inside a batch. Approvals are
// signatures made off the control plane (`better-compute batch approve`);
// the server only checks and stores them, and nodes check them again.
func BatchMethods(m BatchModules) []Method {
	type createIn struct {
		Leaves         []quorum.LeafInput `json:"leaves"`
		ExpiresSeconds int64              `json:"expires_seconds"`
	}
	type idIn struct {
		ID string `json:"id"`
	}
	type approveIn struct {
		ID          string `json:"id"`
		ApproverKey []byte `json:"approver_key"` // base64 Ed25519 public key
		Signature   []byte `json:"signature"`    // base64
	}
	type signSetIn struct {
		Generation  uint64   `json:"generation"`
		Threshold   int      `json:"threshold"`
		Keys        [][]byte `json:"keys"` // base64 Ed25519 public keys
		ApproverKey []byte   `json:"approver_key"`
		Signature   []byte   `json:"signature"`
	}
	type runIn struct {
		NodeID     string          `json:"node_id"`
		Kind       string          `json:"kind"`
		Payload    json.RawMessage `json:"payload"`
		TTLSeconds int64           `json:"ttl_seconds"`
		BatchID    string          `json:"batch_id"`
	}
	return []Method{
		{Name: "batches.create", Action: "compute:batches:create", Mutates: true, Handle: Handler(func(ctx context.Context, c *Caller, in createIn) (any, error) {
			if err := requireRoot(c); err != nil {
				return nil, err
			}
			return m.Quorum.Create(ctx, c.Actor(), in.Leaves, time.Duration(in.ExpiresSeconds)*time.Second)
		})},
		{Name: "batches.get", Action: "compute:batches:get", Handle: Handler(func(ctx context.Context, c *Caller, in idIn) (any, error) {
			if err := requireRoot(c); err != nil {
				return nil, err
			}
			return m.Quorum.Get(ctx, c.TenantID, in.ID)
		})},
		{Name: "batches.list", Action: "compute:batches:list", Handle: Handler(func(ctx context.Context, c *Caller, _ struct{}) (any, error) {
			if err := requireRoot(c); err != nil {
				return nil, err
			}
			bs, err := m.Quorum.List(ctx, c.TenantID)
			if err != nil {
				return nil, err
			}
			return map[string]any{"batches": bs}, nil
		})},
		{Name: "batches.approve", Action: "compute:batches:approve", Mutates: true, Handle: Handler(func(ctx context.Context, c *Caller, in approveIn) (any, error) {
			if err := requireRoot(c); err != nil {
				return nil, err
			}
			if in.ID == "" || len(in.ApproverKey) == 0 || len(in.Signature) == 0 {
				return nil, errs.New(errs.InvalidInput, "id, approver_key and signature are required")
			}
			return m.Quorum.Approve(ctx, c.Actor(), in.ID, in.ApproverKey, in.Signature)
		})},
		{Name: "approvers.get", Action: "compute:approvers:get", Handle: Handler(func(ctx context.Context, c *Caller, _ struct{}) (any, error) {
			if err := requireRoot(c); err != nil {
				return nil, err
			}
			return m.Quorum.CurrentView(ctx)
		})},
		{Name: "approvers.sign", Action: "compute:approvers:sign", Mutates: true, Handle: Handler(func(ctx context.Context, c *Caller, in signSetIn) (any, error) {
			if err := requireRoot(c); err != nil {
				return nil, err
			}
			return m.Quorum.SignApproverSet(ctx, c.Actor(), in.Generation, in.Threshold, in.Keys, in.ApproverKey, in.Signature)
		})},
		{Name: "commands.createInBatch", Action: "compute:commands:create", Mutates: true, Handle: Handler(func(ctx context.Context, c *Caller, in runIn) (any, error) {
			if in.NodeID == "" || in.Kind == "" || in.BatchID == "" {
				return nil, errs.New(errs.InvalidInput, "node_id, kind and batch_id are required")
			}
			return m.Commands.CreateInBatch(ctx, c.Actor(), in.NodeID, in.Kind, in.Payload, time.Duration(in.TTLSeconds)*time.Second, in.BatchID)
		})},
	}
}
