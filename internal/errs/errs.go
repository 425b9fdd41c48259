// Package errs defines the small set of error codes every transport speaks.
//
// A client sees a Code and a safe message; detail stays in the wrapped cause,
// which only goes to the log. Test for a code with errors.As(err, &*errs.Error)
// or errs.CodeOf(err).
package errs

import (
	"errors"
	"net/http"
)

// Code is a stable, documented error code.
type Code string

// The codes. Their HTTP statuses are in HTTPStatus.
const (
	AccessDenied    Code = "ACCESS_DENIED"
	Unauthenticated Code = "UNAUTHENTICATED"
	InvalidInput    Code = "INVALID_INPUT"
	InvalidState    Code = "INVALID_STATE"
	InvalidConfig   Code = "INVALID_CONFIG"
	NotFound        Code = "NOT_FOUND"
	Conflict        Code = "CONFLICT"
	RateLimited     Code = "RATE_LIMITED"
	// ResourceExhausted: a tenant's quota would be exceeded (HTTP 429, as
	// gRPC maps it, but without Retry-After: waiting alone does not help;
	// the tenant must free something or a root operator raise the quota).
	ResourceExhausted Code = "RESOURCE_EXHAUSTED"
	PayloadTooLarge   Code = "PAYLOAD_TOO_LARGE"
	CSRFRejected      Code = "CSRF_REJECTED"
	UntrustedOrigin   Code = "UNTRUSTED_ORIGIN"
	TenantSuspended   Code = "TENANT_SUSPENDED"
	// Unavailable: the service cannot take the call now for a reason of
	// its own that does not depend on the call (the database is full);
	// the same call may succeed later (HTTP 503).
	Unavailable Code = "UNAVAILABLE"
	Internal    Code = "INTERNAL_ERROR"
	// ApprovalRequired: a bastion asks its person to approve the request
	// on the machine (bcd bastion approve), after which the same request
	// is sent again with the approval's id (HTTP 409).
	ApprovalRequired Code = "APPROVAL_REQUIRED"
	// ConfirmationRequired: an agent's call waits for its person's
	// confirmation (better-compute approvals approve ID); the message
	// names the request's id and the text the person reads, and the same
	// call sent again after the approval goes through once (HTTP 409).
	ConfirmationRequired Code = "CONFIRMATION_REQUIRED"
)

// Error is a coded error: Message is safe to show a caller, Cause is not.
type Error struct {
	Code    Code
	Message string
	Cause   error
}

// Error returns the code and safe message (never the cause, which may hold
// internal detail; log it with Unwrap).
func (e *Error) Error() string {
	if e.Cause != nil {
		return string(e.Code) + ": " + e.Message + ": " + e.Cause.Error()
	}
	return string(e.Code) + ": " + e.Message
}

// Unwrap returns the internal cause.
func (e *Error) Unwrap() error { return e.Cause }

// New makes a coded error with a safe message.
func New(code Code, msg string) *Error { return &Error{Code: code, Message: msg} }

// Wrap makes a coded error with a safe message and an internal cause.
func Wrap(code Code, msg string, cause error) *Error {
	return &Error{Code: code, Message: msg, Cause: cause}
}

// CodeOf returns the code of the first coded error in err's chain, or
// Internal when there is none (an unexpected error is never shown as is).
func CodeOf(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return Internal
}

// SafeMessage returns the message a caller may see for err.
func SafeMessage(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Message
	}
	return "internal error"
}

// HTTPStatus maps a code to the HTTP status that fits it.
func HTTPStatus(c Code) int {
	switch c {
	case AccessDenied, UntrustedOrigin:
		return http.StatusForbidden
	case CSRFRejected:
		return http.StatusForbidden
	case Unauthenticated:
		return http.StatusUnauthorized
	case InvalidInput, InvalidConfig:
		return http.StatusBadRequest
	case InvalidState, Conflict, ApprovalRequired, ConfirmationRequired:
		return http.StatusConflict
	case NotFound:
		return http.StatusNotFound
	case RateLimited, ResourceExhausted:
		return http.StatusTooManyRequests
	case PayloadTooLarge:
		return http.StatusRequestEntityTooLarge
	case TenantSuspended:
		return http.StatusForbidden
	case Unavailable:
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}
