package previewtoken

import "errors"

// Reasons a token is refused, by Verify (and, for ReasonBadClaims and
// ReasonBadTTL, by Issue). They are stable and asserted exactly by tests.
const (
	// ReasonMalformed: the token is not exactly v1.<kid>.<payload>.<sig>
	// in canonical form (over MaxTokenLen bytes, a character outside
	// [A-Za-z0-9._-], another field count, a kid that is not 16 lowercase
	// hex digits, padded or non-canonical base64url, a signature of the
	// wrong length). Decided before any key is looked up.
	ReasonMalformed = "preview-malformed"
	// ReasonUnknownKey: the kid names no key of the verifier (a key
	// rotated away, or never ours).
	ReasonUnknownKey = "preview-unknown-key"
	// ReasonBadSignature: the signature does not verify under the kid's
	// key over the context and the token's bytes.
	ReasonBadSignature = "preview-bad-signature"
	// ReasonExpired: now is at or after the token's expiry.
	ReasonExpired = "preview-expired"
	// ReasonWrongSandbox: the token is for another sandbox.
	ReasonWrongSandbox = "preview-wrong-sandbox"
	// ReasonWrongPort: the token is for another port of the sandbox.
	ReasonWrongPort = "preview-wrong-port"
	// ReasonBadClaims: the signed payload is not exactly the canonical
	// claims JSON Issue writes, or its claims are invalid (Verify); the
	// claims given to Issue are invalid (an empty id, an id over 64
	// characters or outside [A-Za-z0-9_-], port 0, an expiry outside
	// Unix nanoseconds).
	ReasonBadClaims = "preview-bad-claims"
	// ReasonBadTTL: Issue was asked for an expiry not after now, or more
	// than maxTTL after it.
	ReasonBadTTL = "preview-bad-ttl"
)

// RefusedError is a refusal: Reason is one of the Reason constants and
// Detail a constant description of the check (never token bytes, never
// key material), so it is safe to log.
type RefusedError struct {
	Reason string
	Detail string
}

// Error returns the reason and, when there is one, the detail.
func (e *RefusedError) Error() string {
	if e.Detail == "" {
		return "previewtoken: " + e.Reason
	}
	return "previewtoken: " + e.Reason + ": " + e.Detail
}

// RefusalReason returns Reason, for callers that recognise refusals by
// interface.
func (e *RefusedError) RefusalReason() string { return e.Reason }

// ReasonOf returns the Reason of the RefusedError in err's chain, or ""
// when there is none.
func ReasonOf(err error) string {
	var r *RefusedError
	if errors.As(err, &r) {
		return r.Reason
	}
	return ""
}

func refuse(reason, detail string) error {
	return &RefusedError{Reason: reason, Detail: detail}
}
