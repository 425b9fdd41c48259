package apitypes

import (
	"encoding/json"
	"time"
)

// BastionPairTokenIn is bastions.pairToken's input: the bastion's name and
// the token's lifetime (0: one hour; at most seven days).
type BastionPairTokenIn struct {
	TenantIn
	Name       string `json:"name" api:"max=63"`
	TTLSeconds int64  `json:"ttl_seconds" api:"min=0,max=604800"`
}

// BastionPairToken is bastions.pairToken's answer: the one-time pairing
// token (shown once, never stored), its id and expiry.
type BastionPairToken struct {
	Token     string    `json:"token"`
	TokenID   string    `json:"token_id"`
	ExpiresAt time.Time `json:"expires_at"`
}

// BastionSummary is a bastion as bastions.list shows it: connected is its
// session's state; families are the effective families of its live grants
// (a deny in any grant beats every allow).
type BastionSummary struct {
	ID        string   `json:"id"`
	Name      string   `json:"name"`
	Connected bool     `json:"connected"`
	Families  []string `json:"families"`
}

// Bastion is bastions.get's answer.
type Bastion struct {
	BastionSummary
	TenantID         string     `json:"tenant_id"`
	State            string     `json:"state"`
	TunnelAddr       string     `json:"tunnel_addr,omitempty"`
	WGKeyFingerprint string     `json:"wg_key_fingerprint,omitempty"`
	Grants           int        `json:"grants"`
	CreatedAt        time.Time  `json:"created_at"`
	UnpairedAt       *time.Time `json:"unpaired_at,omitempty"`
}

// BastionGrantIn is bastions.grant's input: the families allowed and
// denied (inference, models, services, egress), the models in scope, the
// service-slot servers the grant reaches, and its lifetime (0: 24 hours;
// at most 30 days).
type BastionGrantIn struct {
	BastionID  string   `json:"bastion_id" api:"max=64"`
	Allow      []string `json:"allow" api:"items=8,max=32"`
	Deny       []string `json:"deny" api:"items=8,max=32"`
	Models     []string `json:"models" api:"items=16,max=128"`
	Reach      []string `json:"reach" api:"items=64,max=63"`
	TTLSeconds int64    `json:"ttl_seconds" api:"min=0,max=2592000"`
}

// BastionIDIn names one bastion (bastions.grants).
type BastionIDIn struct {
	BastionID string `json:"bastion_id" api:"max=64"`
}

// BastionGrant is a grant as the API shows it (never its signed bytes,
// which go only to the bastion).
type BastionGrant struct {
	ID        string     `json:"id"`
	BastionID string     `json:"bastion_id"`
	TenantID  string     `json:"tenant_id"`
	Allow     []string   `json:"allow"`
	Deny      []string   `json:"deny"`
	Models    []string   `json:"models"`
	Reach     []string   `json:"reach"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt time.Time  `json:"expires_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
	CreatedBy string     `json:"created_by"`
	Revoked   bool       `json:"revoked"`
	Expired   bool       `json:"expired"`
}

// BastionOpIn is bastions.op's input: the bastion, the op's kind (such as
// observe:disk or files:read), its arguments (a JSON object, checked by
// the bastion against the kind's schema) and, when repeating an op the
// bastion asked approval for, the approval request's id.
type BastionOpIn struct {
	BastionID string          `json:"bastion_id" api:"max=64"`
	Kind      string          `json:"kind" api:"max=64"`
	Args      json.RawMessage `json:"args,omitempty"`
	Approval  string          `json:"approval,omitempty" api:"max=24"`
}

// BastionOpAnswer is bastions.op's answer: status "done" with the op's
// result, or "approval-required" with the approval request the person
// approves on the machine (bcd bastion approve ID) before the same op is
// sent again with approval set.
type BastionOpAnswer struct {
	Status          string          `json:"status"`
	Kind            string          `json:"kind"`
	OpID            string          `json:"op_id"`
	Result          json.RawMessage `json:"result,omitempty"`
	ApprovalRequest string          `json:"approval_request,omitempty"`
	ApprovalExpires *time.Time      `json:"approval_expires,omitempty"`
	Summary         string          `json:"summary,omitempty"`
}
