package console

import (
	"encoding/json"
	"time"
)

// The types below are the parts of the API's JSON answers the pages show,
// decoded from the envelope's answers as any HTTP client decodes them
// (the console is a client of the API; it imports none of the api
// packages). Fields the pages do not show are left out.

// idIn is the input of a method that names one resource.
type idIn struct {
	ID string `json:"id"`
}

// commandListIn is commands.list's input.
type commandListIn struct {
	Limit int `json:"limit,omitempty"`
}

// auditProveIn is audit.prove's input.
type auditProveIn struct {
	EventID string `json:"event_id"`
}

// node is a node as nodes.list shows it.
type node struct {
	ID          string            `json:"id"`
	Name        string            `json:"name"`
	Connected   bool              `json:"connected"`
	Labels      map[string]string `json:"labels"`
	State       string            `json:"state"`
	StateReason string            `json:"state_reason"`
}

// command is a command as commands.get and commands.list show it.
type command struct {
	ID        string          `json:"id"`
	NodeID    string          `json:"node_id"`
	Kind      string          `json:"kind"`
	Payload   json.RawMessage `json:"payload"`
	State     string          `json:"state"`
	Attested  bool            `json:"attested"`
	Result    json.RawMessage `json:"result"`
	Reason    string          `json:"reason"`
	CreatedBy string          `json:"created_by"`
	CreatedAt time.Time       `json:"created_at"`
	ExpiresAt time.Time       `json:"expires_at"`
	BatchID   string          `json:"batch_id"`
}

// attestation is commands.attestation's answer.
type attestation struct {
	CommandID    string `json:"command_id"`
	Context      string `json:"context"`
	SignedBody   []byte `json:"signed_body"`
	Signature    []byte `json:"signature"`
	CertChainPEM string `json:"cert_chain_pem"`
}

// batchLeaf is one leaf of a destructive batch.
type batchLeaf struct {
	Index         int    `json:"index"`
	NodeID        string `json:"node_id"`
	Kind          string `json:"kind"`
	Unbound       bool   `json:"unbound"`
	Flag          string `json:"flag"`
	PayloadSHA256 string `json:"payload_sha256"`
}

// batchApproval is one approver's signature on a batch.
type batchApproval struct {
	ApproverKey string    `json:"approver_key"`
	SubmittedBy string    `json:"submitted_by"`
	CreatedAt   time.Time `json:"created_at"`
}

// batch is a destructive batch as batches.get and batches.list show it.
type batch struct {
	ID         string          `json:"id"`
	Deployment string          `json:"deployment"`
	Root       string          `json:"root"`
	State      string          `json:"state"`
	Threshold  int             `json:"threshold"`
	Approvals  []batchApproval `json:"approvals"`
	Leaves     []batchLeaf     `json:"leaves"`
	ProposedBy string          `json:"proposed_by"`
	Agent      string          `json:"agent"`
	AgentFor   string          `json:"agent_for"`
	ExpiresAt  time.Time       `json:"expires_at"`
}

// sandbox is a sandbox as sandboxes.list shows it.
type sandbox struct {
	ID         string    `json:"id"`
	TemplateID string    `json:"template_id"`
	NodeID     string    `json:"node_id"`
	Runtime    string    `json:"runtime"`
	State      string    `json:"state"`
	Reason     string    `json:"reason"`
	ExpiresAt  time.Time `json:"expires_at"`
}

// auditEvent is one row of audit.list's answer.
type auditEvent struct {
	ID       string    `json:"id"`
	Seq      *int64    `json:"seq"`
	Sealed   bool      `json:"sealed"`
	At       time.Time `json:"at"`
	Actor    string    `json:"actor"`
	Action   string    `json:"action"`
	Resource string    `json:"resource"`
	Outcome  string    `json:"outcome"`
}

// auditProof is audit.prove's answer: the proof file's text.
type auditProof struct {
	Proof string `json:"proof"`
}
