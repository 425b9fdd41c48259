package client

import (
	"context"
	"encoding/json"
	"time"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
)

// BatchLeaf is one leaf of a batch as shown: a node, a kind and either a
// payload digest (with the payload) or Unbound, which admits any payload
// of its kind for its node and carries Flag.
type BatchLeaf = apitypes.BatchLeaf

// BatchApproval is one recorded approval.
type BatchApproval = apitypes.BatchApproval

// Batch is a destructive batch as the API shows it. Root is the server's
// claim; a reviewer recomputes it from Leaves before signing.
type Batch = apitypes.Batch

// LeafRequest asks for one leaf in a new batch.
type LeafRequest = apitypes.LeafIn

// CreateBatch proposes a batch of leaves expiring after expires (0: the
// server's default).
func (c *Client) CreateBatch(ctx context.Context, leaves []LeafRequest, expires time.Duration) (Batch, error) {
	var out Batch
	err := c.Call(ctx, "batches.create", apitypes.BatchCreateIn{Leaves: leaves, ExpiresSeconds: int64(expires / time.Second)}, &out)
	return out, err
}

// Batch reads a batch with its leaves and approvals.
func (c *Client) Batch(ctx context.Context, id string) (Batch, error) {
	var out Batch
	err := c.Call(ctx, "batches.get", apitypes.IDIn{ID: id}, &out)
	return out, err
}

// Batches lists the newest batches.
func (c *Client) Batches(ctx context.Context) ([]Batch, error) {
	var out struct {
		Batches []Batch `json:"batches"`
	}
	err := c.Call(ctx, "batches.list", nil, &out)
	return out.Batches, err
}

// ApproveBatch submits one approver's signature (made off the control
// plane) over the batch.
func (c *Client) ApproveBatch(ctx context.Context, id string, approverKey, sig []byte) (Batch, error) {
	var out Batch
	err := c.Call(ctx, "batches.approve", apitypes.BatchApproveIn{ID: id, ApproverKey: approverKey, Signature: sig}, &out)
	return out, err
}

// CreateCommandInBatch queues a command that runs only under batch batchID.
func (c *Client) CreateCommandInBatch(ctx context.Context, nodeID, kind string, payload json.RawMessage, batchID string) (Command, error) {
	var out Command
	err := c.Call(ctx, "commands.createInBatch", apitypes.CommandInBatchIn{NodeID: nodeID, Kind: kind, Payload: payload, BatchID: batchID}, &out)
	return out, err
}

// ApproverSet is the approver set in force.
type ApproverSet = apitypes.ApproverSet

// Approvers reads the approver set in force.
func (c *Client) Approvers(ctx context.Context) (ApproverSet, error) {
	var out ApproverSet
	err := c.Call(ctx, "approvers.get", nil, &out)
	return out, err
}

// ApproverSetStatus reports a proposed approver-set change.
type ApproverSetStatus = apitypes.ApproverSetStatus

// SignApprovers submits one current approver's signature over a new set.
func (c *Client) SignApprovers(ctx context.Context, generation uint64, threshold int, keys [][]byte, approverKey, sig []byte) (ApproverSetStatus, error) {
	var out ApproverSetStatus
	err := c.Call(ctx, "approvers.sign", apitypes.ApproverSignIn{Generation: generation, Threshold: threshold, Keys: keys,
		ApproverKey: approverKey, Signature: sig}, &out)
	return out, err
}
