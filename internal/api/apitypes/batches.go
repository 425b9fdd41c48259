package apitypes

import "encoding/json"

// LeafIn asks for one leaf in a new batch: a node, a kind and either a
// payload or Unbound (any payload of its kind for its node).
type LeafIn struct {
	NodeID  string          `json:"node_id" api:"max=64"`
	Kind    string          `json:"kind" api:"max=64"`
	Payload json.RawMessage `json:"payload,omitempty"`
	Unbound bool            `json:"unbound,omitempty"`
}

// BatchCreateIn is batches.create's input.
type BatchCreateIn struct {
	Leaves         []LeafIn `json:"leaves" api:"items=4096"`
	ExpiresSeconds int64    `json:"expires_seconds" api:"min=0,max=604800"`
}

// BatchApproveIn is batches.approve's input: one approver's signature
// made off the control plane.
type BatchApproveIn struct {
	ID          string `json:"id" api:"max=64"`
	ApproverKey []byte `json:"approver_key" api:"max=64"` // base64 Ed25519 public key
	Signature   []byte `json:"signature" api:"max=128"`   // base64
}

// ApproverSignIn is approvers.sign's input: one current approver's
// signature over a new approver set.
type ApproverSignIn struct {
	Generation  uint64   `json:"generation" api:"min=1,max=9007199254740991"`
	Threshold   int      `json:"threshold" api:"min=1,max=32"`
	Keys        [][]byte `json:"keys" api:"items=32,max=64"` // base64 Ed25519 public keys
	ApproverKey []byte   `json:"approver_key" api:"max=64"`
	Signature   []byte   `json:"signature" api:"max=128"`
}

// CommandInBatchIn is commands.createInBatch's input.
type CommandInBatchIn struct {
	NodeID     string          `json:"node_id" api:"max=64"`
	Kind       string          `json:"kind" api:"max=64"`
	Payload    json.RawMessage `json:"payload,omitempty"`
	TTLSeconds int64           `json:"ttl_seconds,omitempty" api:"min=0,max=86400"`
	BatchID    string          `json:"batch_id" api:"max=64"`
}
