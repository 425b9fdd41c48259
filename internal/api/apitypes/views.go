package apitypes

import (
	"encoding/json"
	"time"
)

// The answers below are the modules' own types on the server (nodes.Node,
// commands.Command, iam.Tenant, quorum.Batch, sandboxes.Sandbox, ...); these
// are their wire shapes as the client reads them, declared once here.
// TestWireViewsMatchModules in package api holds every field of each to a
// field of the module's type with the same JSON name and type.

// Node is a node as listed.
type Node struct {
	ID         string            `json:"id"`
	Name       string            `json:"name"`
	TenantID   string            `json:"tenant_id"`
	Role       string            `json:"role"`
	Connected  bool              `json:"connected"`
	BootID     string            `json:"boot_id,omitempty"`
	Version    string            `json:"version,omitempty"`
	Labels     map[string]string `json:"labels"`
	Inventory  json.RawMessage   `json:"inventory"`
	CreatedAt  time.Time         `json:"created_at"`
	LastSeenAt *time.Time        `json:"last_seen_at,omitempty"`
	// State is active, revoked, quarantined or expired; StateReason says
	// why a node is not active.
	State       string `json:"state"`
	StateReason string `json:"state_reason,omitempty"`
}

// JoinToken is a created join token; Token is shown once.
type JoinToken struct {
	ID        string    `json:"id"`
	Token     string    `json:"token"`
	Role      string    `json:"role"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Command is a command as the API shows it.
type Command struct {
	ID        string          `json:"id"`
	NodeID    string          `json:"node_id"`
	TenantID  string          `json:"tenant_id"`
	Kind      string          `json:"kind"`
	Payload   json.RawMessage `json:"payload"`
	State     string          `json:"state"`
	Attested  bool            `json:"attested"`
	Result    json.RawMessage `json:"result"`
	Reason    string          `json:"reason"`
	CreatedBy string          `json:"created_by"`
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
	ExpiresAt time.Time       `json:"expires_at"`
	BatchID   string          `json:"batch_id,omitempty"`
	FanoutID  string          `json:"fanout_id,omitempty"`
	// Late: the node's attested result arrived after the command had
	// been cancelled as expired; State is what the node reported.
	Late bool `json:"late"`
}

// Terminal reports whether the command's state is final.
func (c Command) Terminal() bool {
	return c.State == "succeeded" || c.State == "failed" || c.State == "cancelled"
}

// Tenant is a tenant.
type Tenant struct {
	ID       string `json:"id"`
	ParentID string `json:"parent_id,omitempty"`
	Name     string `json:"name"`
	State    string `json:"state"`
}

// Identity is a person or agent.
type Identity struct {
	ID       string `json:"id"`
	TenantID string `json:"tenant_id"`
	Name     string `json:"name"`
	Kind     string `json:"kind"`
}

// Binding gives an identity a role in a tenant and every tenant below it.
type Binding struct {
	ID               string    `json:"id"`
	TenantID         string    `json:"tenant_id"`
	IdentityID       string    `json:"identity_id"`
	IdentityName     string    `json:"identity_name"`
	IdentityTenantID string    `json:"identity_tenant_id"`
	RoleID           string    `json:"role_id"`
	RoleName         string    `json:"role_name"`
	CreatedAt        time.Time `json:"created_at"`
}

// Attestation is a command's attested result as the API returns it: the
// exact bytes the node signed, the signature over SHA-256(Context ||
// SignedBody), and the node's certificate chain (PEM).
type Attestation struct {
	CommandID    string `json:"command_id"`
	Context      string `json:"context"`
	SignedBody   []byte `json:"signed_body"`
	Signature    []byte `json:"signature"`
	CertChainPEM string `json:"cert_chain_pem"`
}

// BatchLeaf is one leaf of a batch as shown: a node, a kind and either a
// payload digest (with the payload) or Unbound, which admits any payload
// of its kind for its node and carries Flag.
type BatchLeaf struct {
	Index         int             `json:"index"`
	NodeID        string          `json:"node_id"`
	Kind          string          `json:"kind"`
	Unbound       bool            `json:"unbound"`
	Flag          string          `json:"flag,omitempty"`
	PayloadSHA256 string          `json:"payload_sha256,omitempty"`
	Payload       json.RawMessage `json:"payload,omitempty"`
}

// BatchApproval is one recorded approval.
type BatchApproval struct {
	ApproverKey string    `json:"approver_key"`
	Signature   string    `json:"signature"`
	SubmittedBy string    `json:"submitted_by"`
	CreatedAt   time.Time `json:"created_at"`
}

// Batch is a destructive batch as the API shows it. Root is the server's
// claim; a reviewer recomputes it from Leaves before signing.
type Batch struct {
	ID         string          `json:"id"`
	TenantID   string          `json:"tenant_id"`
	Deployment string          `json:"deployment"`
	Root       string          `json:"root"`
	State      string          `json:"state"`
	Threshold  int             `json:"threshold"`
	Approvals  []BatchApproval `json:"approvals"`
	Leaves     []BatchLeaf     `json:"leaves"`
	Unbound    bool            `json:"unbound"`
	ProposedBy string          `json:"proposed_by"`
	Agent      string          `json:"agent,omitempty"`
	AgentFor   string          `json:"agent_for,omitempty"`
	Proposer   string          `json:"proposer"`
	CreatedAt  time.Time       `json:"created_at"`
	ExpiresAt  time.Time       `json:"expires_at"`
	ExpiresMS  int64           `json:"expires_at_ms"`
	ApprovedAt *time.Time      `json:"approved_at,omitempty"`
}

// ApproverSet is the approver set in force.
type ApproverSet struct {
	Deployment string   `json:"deployment"`
	Generation uint64   `json:"generation"`
	Threshold  int      `json:"threshold"`
	Keys       []string `json:"keys"`
}

// ApproverSetStatus reports a proposed approver-set change.
type ApproverSetStatus struct {
	Proposed ApproverSet `json:"proposed"`
	Signed   int         `json:"signed"`
	Needed   int         `json:"needed"`
	Applied  bool        `json:"applied"`
	Approver string      `json:"approver"`
}

// Image is a named, content-addressed sandbox image.
type Image struct {
	ID        string `json:"id"`
	TenantID  string `json:"tenant_id"`
	Name      string `json:"name"`
	Digest    string `json:"digest"`
	SizeBytes int64  `json:"size_bytes"`
}

// Sandbox is a sandbox as the API shows it.
type Sandbox struct {
	ID         string    `json:"id"`
	TenantID   string    `json:"tenant_id"`
	TemplateID string    `json:"template_id"`
	NodeID     string    `json:"node_id"`
	Runtime    string    `json:"runtime"`
	State      string    `json:"state"`
	Reason     string    `json:"reason"`
	FromWarm   bool      `json:"from_warm"`
	CreatedAt  time.Time `json:"created_at"`
	ExpiresAt  time.Time `json:"expires_at"`
	MaxExpires time.Time `json:"max_expires_at"`
	// FromCheckpoint is the checkpoint the sandbox was restored from.
	FromCheckpoint string `json:"from_checkpoint,omitempty"`
}

// ExecResult is the answer of sandboxes.exec: each stream capped, with
// truncation flagged, and the exit code of the sandbox's command.
type ExecResult struct {
	SandboxID       string `json:"sandbox_id"`
	CommandID       string `json:"command_id"`
	Attested        bool   `json:"attested"`
	ExitCode        int    `json:"exit_code"`
	Stdout          []byte `json:"stdout"`
	Stderr          []byte `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	TimedOut        bool   `json:"timed_out"`
}
