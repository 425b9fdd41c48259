package ops

import (
	"errors"
	"time"
)

// Codes a refusal answers with on the wire (b19-wire.md).
const (
	// CodeInvalidInput: the op is malformed, of an unknown kind, or its
	// args do not match the kind's schema (HTTP 400).
	CodeInvalidInput = "INVALID_INPUT"
	// CodeAccessDenied: the op is well formed and refused (HTTP 403).
	CodeAccessDenied = "ACCESS_DENIED"
	// CodeNotFound: what the op names does not exist (HTTP 404).
	CodeNotFound = "NOT_FOUND"
	// CodeApprovalRequired: the person must approve the op on the machine
	// (HTTP 409).
	CodeApprovalRequired = "APPROVAL_REQUIRED"
	// CodeInternal: the op failed for a reason that is not a refusal
	// (HTTP 500); the detail goes only to the log.
	CodeInternal = "INTERNAL_ERROR"
)

// Reasons this package gives. Handlers' and the approval store's own
// reasons are passed through unchanged (see refusalOf).
const (
	// ReasonMalformed: the body is not one strict JSON op (size, UTF-8,
	// unknown or repeated field, trailing data, op_id or approval shape),
	// or a terminal request's query or upgrade headers are wrong.
	ReasonMalformed = "malformed-op"
	// ReasonBodyTooLarge: the body is over MaxBody.
	ReasonBodyTooLarge = "body-too-large"
	// ReasonUnknownKind: the kind is not one this bastion knows.
	ReasonUnknownKind = "unknown-kind"
	// ReasonBadArgs: the args do not match the kind's schema.
	ReasonBadArgs = "bad-args"
	// ReasonWritesLocked: repeated refused writes closed the write lanes.
	ReasonWritesLocked = "writes-locked"
	// ReasonFactorNotEnrolled: a write needs an approval and no second
	// factor is enrolled on the machine.
	ReasonFactorNotEnrolled = "factor-not-enrolled"
	// ReasonApprovalRequired: the person must approve this op on the
	// machine; the refusal carries the request id.
	ReasonApprovalRequired = "approval-required"
	// ReasonNotRoot: the op needs the bastion running as root.
	ReasonNotRoot = "not-root"
	// ReasonAskRoot: a terminal not asked as root on a bastion running as
	// root (its shell would be root's).
	ReasonAskRoot = "terminal-would-be-root"
	// ReasonTooLarge: a handler's answer is over its limit (files:read).
	ReasonTooLarge = "too-large"
	// ReasonRefused: a handler refused with a reason that is not a short
	// kebab-case code, so it is not passed on.
	ReasonRefused = "refused"
	// ReasonNoSuchEndpoint: the HTTP method and path are not an endpoint.
	ReasonNoSuchEndpoint = "no-such-endpoint"
	// ReasonInternal: the reason sent with CodeInternal.
	ReasonInternal = "internal"
)

// EnrollHint is the message of a factor-not-enrolled refusal.
const EnrollHint = "enroll a second factor on the machine: bcd bastion enroll"

// RefusedError is a refusal of an op. Code is the wire code, Reason a
// kebab-case constant, Detail safe text sent as the message. An
// APPROVAL_REQUIRED refusal also carries the approval request's id, its
// expiry and the summary shown to the person.
type RefusedError struct {
	Code, Reason, Detail string
	ApprovalRequest      string
	ApprovalExpires      time.Time
	Summary              string
}

// Error returns the reason and the safe detail.
func (e *RefusedError) Error() string {
	if e.Detail == "" {
		return e.Reason
	}
	return e.Reason + ": " + e.Detail
}

// RefusalReason returns Reason, so other packages recognise the refusal.
func (e *RefusedError) RefusalReason() string { return e.Reason }

func invalid(reason, detail string) *RefusedError {
	return &RefusedError{Code: CodeInvalidInput, Reason: reason, Detail: detail}
}

func denied(reason, detail string) *RefusedError {
	return &RefusedError{Code: CodeAccessDenied, Reason: reason, Detail: detail}
}

// refuser is how a refusal of another package is recognised.
type refuser interface{ RefusalReason() string }

// maxDetail bounds a passed-on refusal's detail.
const maxDetail = 512

// refusalOf turns err into this package's refusal when it is one: ours as
// it is; another package's with its reason (when it is a short kebab-case
// code, else ReasonRefused) and code NOT_FOUND for "not-found" and
// "unknown-..." reasons, ACCESS_DENIED otherwise. It returns nil when err is
// not a refusal.
func refusalOf(err error) *RefusedError {
	var ours *RefusedError
	if errors.As(err, &ours) {
		return ours
	}
	var r refuser
	if !errors.As(err, &r) {
		return nil
	}
	reason := r.RefusalReason()
	if !validReason(reason) {
		reason = ReasonRefused
	}
	code := CodeAccessDenied
	if reason == "not-found" || len(reason) > 8 && reason[:8] == "unknown-" {
		code = CodeNotFound
	}
	return &RefusedError{Code: code, Reason: reason, Detail: cleanClip(err.Error(), maxDetail)}
}

// validReason reports a reason fit for the wire: 1 to 64 bytes of
// lowercase letters, digits and '-'.
func validReason(r string) bool {
	if r == "" || len(r) > 64 {
		return false
	}
	for i := 0; i < len(r); i++ {
		c := r[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
