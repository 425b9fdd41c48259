package apitypes

import "time"

// Whoami is identities.whoami's answer: who the credential speaks for.
type Whoami struct {
	IdentityID   string     `json:"identity_id"`
	IdentityName string     `json:"identity_name"`
	Kind         string     `json:"kind"`
	TenantID     string     `json:"tenant_id"`
	KeyID        string     `json:"key_id"`
	SessionID    string     `json:"session_id,omitempty"`
	Scopes       []string   `json:"scopes"`
	ExpiresAt    *time.Time `json:"expires_at,omitempty"`
}

// TenantDeleted is tenants.delete's answer: the tenant and what its
// teardown ended, summed over it and every tenant below it.
type TenantDeleted struct {
	ID                  string `json:"id"`
	State               string `json:"state"`
	TenantsDeleted      int    `json:"tenants_deleted"`
	TemplatesDeleted    int    `json:"templates_deleted"`
	SandboxesDeleted    int    `json:"sandboxes_deleted"`
	CertificatesRevoked int64  `json:"certificates_revoked"`
	JoinTokensRevoked   int64  `json:"join_tokens_revoked"`
	KeysRevoked         int64  `json:"keys_revoked"`
	SessionsRevoked     int64  `json:"sessions_revoked"`
}

// JoinTokenInfo is a join token as joinTokens.list shows it (its secret
// is never stored).
type JoinTokenInfo struct {
	ID        string     `json:"id"`
	Role      string     `json:"role"`
	Name      string     `json:"name"`
	State     string     `json:"state"`
	CreatedBy string     `json:"created_by"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt time.Time  `json:"expires_at"`
	UsedAt    *time.Time `json:"used_at,omitempty"`
	NodeID    string     `json:"node_id,omitempty"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
}

// ImageDeleteIn is images.delete's input: an image of the tenant by name.
type ImageDeleteIn struct {
	TenantIn
	Name string `json:"name" api:"max=128"`
}
