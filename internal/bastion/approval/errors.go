package approval

// Refusal reasons. Each is a stable kebab-case string that callers compare
// (through RefusalReason) and that the wire carries as "reason".
const (
	// ReasonNotEnrolled: no second factor is enrolled here.
	ReasonNotEnrolled = "not-enrolled"
	// ReasonAlreadyEnrolled: Enroll on a folder that already has a factor.
	ReasonAlreadyEnrolled = "already-enrolled"
	// ReasonFactorDamaged: the factor file exists but does not open.
	ReasonFactorDamaged = "factor-damaged"
	// ReasonCodeInvalid: the code matches no step from now-1 to now+1.
	ReasonCodeInvalid = "code-invalid"
	// ReasonCodeReused: the code's step is at or before the last accepted one.
	ReasonCodeReused = "code-reused"
	// ReasonBadRequest: Ask got an op, digest or summary it cannot hold.
	ReasonBadRequest = "bad-request"
	// ReasonTooManyPending: Ask with MaxPending requests already pending.
	ReasonTooManyPending = "too-many-pending"
	// ReasonUnknownRequest: no request with that id is kept here.
	ReasonUnknownRequest = "unknown-request"
	// ReasonSummaryTooLong: the request's text is longer than MaxSummary
	// runes (it would not be shown whole).
	ReasonSummaryTooLong = "summary-too-long"
	// ReasonApprovalMismatch: the approval is for another op or digest.
	ReasonApprovalMismatch = "approval-mismatch"
	// ReasonNotApproved: the request was not approved on the machine.
	ReasonNotApproved = "not-approved"
	// ReasonApprovalExpired: the request is past its Expires.
	ReasonApprovalExpired = "approval-expired"
	// ReasonApprovalSpent: the approval was already used once.
	ReasonApprovalSpent = "approval-spent"
	// ReasonStateDamaged: the approvals file exists but does not open.
	ReasonStateDamaged = "state-damaged"
	// ReasonBadWindow: a grant's window is empty, over 30 days or past.
	ReasonBadWindow = "bad-window"
	// ReasonBadRate: a standing grant's rate is below 1 or over MaxPerDay.
	ReasonBadRate = "bad-rate"
	// ReasonBadKind: a standing grant's op kind is empty or malformed.
	ReasonBadKind = "bad-kind"
	// ReasonTooManyGrants: GrantStanding with MaxStanding records held.
	ReasonTooManyGrants = "too-many-grants"
	// ReasonNoStanding: no valid standing grant for the op kind.
	ReasonNoStanding = "no-standing-grant"
	// ReasonOutsideWindow: the grant's window does not hold now.
	ReasonOutsideWindow = "outside-window"
	// ReasonRateHour: the grant's runs in the last hour reached PerHour.
	ReasonRateHour = "rate-hour"
	// ReasonRateDay: the grant's runs in the last day reached PerDay.
	ReasonRateDay = "rate-day"
	// ReasonUnknownGrant: no standing grant with that id.
	ReasonUnknownGrant = "unknown-grant"
	// ReasonOpsDamaged: ops.json exists but is not a records file.
	ReasonOpsDamaged = "ops-damaged"
	// ReasonSealBroken: sealed bytes that do not open under the key and
	// additional data given.
	ReasonSealBroken = "seal-broken"
)

// RefusedError is a refusal with a stable Reason and a Detail that is safe
// to show (never a secret or a code).
type RefusedError struct {
	Reason string
	Detail string
}

// Error returns the reason and the detail.
func (e *RefusedError) Error() string {
	if e.Detail == "" {
		return e.Reason
	}
	return e.Reason + ": " + e.Detail
}

// RefusalReason returns Reason, so that other packages recognise the
// refusal through interface{ RefusalReason() string }.
func (e *RefusedError) RefusalReason() string { return e.Reason }

// refuse returns a *RefusedError.
func refuse(reason, detail string) error {
	return &RefusedError{Reason: reason, Detail: detail}
}
