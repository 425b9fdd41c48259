package apitypes

import "time"

// TenantCreateIn is tenants.create's input ("" parent: the caller's tenant).
type TenantCreateIn struct {
	ParentID string `json:"parent_id" api:"max=64"`
	Name     string `json:"name" api:"max=63"`
}

// IdentityCreateIn is identities.create's input. For, with kind agent,
// names the person (of the same tenant) the agent acts for: the agent's
// delegation.
type IdentityCreateIn struct {
	TenantIn
	Name string `json:"name" api:"max=63"`
	Kind string `json:"kind" api:"max=32"`
	For  string `json:"for,omitempty" api:"max=64"`
}

// ApprovalKindsIn is approvals.setKinds' input: the command kinds the
// tenant holds back for an agent's person's confirmation (replacing the
// list; empty holds none back).
type ApprovalKindsIn struct {
	TenantIn
	Kinds []string `json:"kinds" api:"items=64,max=64"`
}

// BindIn is bindings.create's input.
type BindIn struct {
	TenantIn
	IdentityID string `json:"identity_id" api:"max=64"`
	RoleID     string `json:"role_id" api:"max=64"`
}

// APIKeyCreateIn is apiKeys.create's input.
type APIKeyCreateIn struct {
	TenantIn
	IdentityID string   `json:"identity_id" api:"max=64"`
	Name       string   `json:"name" api:"max=128"`
	TTLSeconds int64    `json:"ttl_seconds" api:"min=0,max=31622400"`
	Scopes     []string `json:"scopes,omitempty" api:"items=64,max=128"`
}

// APIKey is apiKeys.create's answer; Key is shown once. ExpiresAt is nil
// for a key that does not expire.
type APIKey struct {
	ExpiresAt  *time.Time `json:"expires_at,omitempty"`
	ID         string     `json:"id"`
	IdentityID string     `json:"identity_id"`
	Key        string     `json:"key"`
	TenantID   string     `json:"tenant_id"`
}

// Session is sessions.create's answer: Value goes into the cookie named
// Cookie and is shown once.
type Session struct {
	Cookie    string    `json:"cookie"`
	ExpiresAt time.Time `json:"expires_at"`
	ID        string    `json:"id"`
	Value     string    `json:"value"`
}
