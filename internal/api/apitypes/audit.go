package apitypes

import "time"

// MaxAuditList bounds the events one audit.list answers (and is its
// default).
const MaxAuditList = 1000

// AuditListIn is audit.list's input: the tenant whose log to read ("" for
// the caller's own), sealed events from seq Since on, at most Limit (0:
// MaxAuditList).
type AuditListIn struct {
	TenantID string `json:"tenant_id,omitempty" api:"max=64"`
	Since    int64  `json:"since,omitempty" api:"min=0,max=9223372036854775807"`
	Limit    int    `json:"limit,omitempty" api:"min=0,max=1000"`
}

// Tenant returns the tenant the input names.
func (in AuditListIn) Tenant() string { return in.TenantID }

// AuditProveIn is audit.prove's input: one event of a tenant's log ("" for
// the caller's own tenant).
type AuditProveIn struct {
	TenantID string `json:"tenant_id,omitempty" api:"max=64"`
	EventID  string `json:"event_id" api:"max=64"`
}

// Tenant returns the tenant the input names.
func (in AuditProveIn) Tenant() string { return in.TenantID }

// AuditEvent is one row of a tenant's audit log: Seq is nil until the row
// is numbered, Sealed once a signed checkpoint covers it. The server
// converts auditlog.Event to it, so the two cannot drift apart.
type AuditEvent struct {
	ID        string    `json:"id"`
	Seq       *int64    `json:"seq"`
	Sealed    bool      `json:"sealed"`
	At        time.Time `json:"at"`
	Actor     string    `json:"actor"`
	Action    string    `json:"action"`
	Resource  string    `json:"resource"`
	Outcome   string    `json:"outcome"`
	RequestID string    `json:"request_id"`
	Caller    string    `json:"caller"`
	Details   string    `json:"details"`
}

// AuditList is audit.list's answer, in the one list shape: the events of
// the tenant the call acts in.
type AuditList struct {
	Events []AuditEvent `json:"events"`
}

// AuditProof is audit.prove's answer: the event's inclusion proof in its
// tenant's latest checkpoint, as the C2SP tlog-proof@v1 text that
// `better-compute audit check-proof` checks offline.
type AuditProof struct {
	TenantID string `json:"tenant_id"`
	EventID  string `json:"event_id"`
	Index    uint64 `json:"index"`
	Proof    string `json:"proof"`
}
