package forward

import "net/http"

// Reason is the stable, lowercase code of one refusal. Clients and the
// audit chain see it; tests assert it exactly.
type Reason string

// The refusals a forward answers.
const (
	// ReasonInferenceNotGranted: the pairing's grant lacks the
	// "inference" family (checked at accept and again per request).
	ReasonInferenceNotGranted Reason = "inference-not-granted"
	// ReasonModelsNotGranted: a model store path without the "models"
	// family.
	ReasonModelsNotGranted Reason = "models-not-granted"
	// ReasonModelOutOfScope: the request names a model outside the
	// pairing's scope, names none on a path that takes one, or carries a
	// field whose model cannot be checked (/api/create's modelfile, path).
	ReasonModelOutOfScope Reason = "model-out-of-scope"
	// ReasonPathNotAllowed: the path (or method) is not on the kind's list.
	ReasonPathNotAllowed Reason = "path-not-allowed"
	// ReasonBusy: the pairing's streams are all in use.
	ReasonBusy Reason = "busy"
	// ReasonBodyTooLarge: the request body is over MaxBodyBytes.
	ReasonBodyTooLarge Reason = "body-too-large"
	// ReasonMalformedBody: a body that must be one JSON object is not, a
	// model field is not a string, or the body is content-encoded.
	ReasonMalformedBody Reason = "malformed-body"
	// ReasonUpstreamUnreachable: no checked upstream address answered, or
	// one is no longer this machine.
	ReasonUpstreamUnreachable Reason = "upstream-unreachable"
	// ReasonModelListTooLarge: a model list response over MaxListBytes.
	ReasonModelListTooLarge Reason = "model-list-too-large"
	// ReasonUpstreamResponseRefused: the upstream's answer cannot be passed
	// on safely (a model list that does not parse, a protocol switch).
	ReasonUpstreamResponseRefused Reason = "upstream-response-refused"
)

// status is the HTTP status a refusal is answered with.
func (r Reason) status() int {
	switch r {
	case ReasonBusy:
		return http.StatusServiceUnavailable
	case ReasonBodyTooLarge:
		return http.StatusRequestEntityTooLarge
	case ReasonMalformedBody:
		return http.StatusBadRequest
	case ReasonUpstreamUnreachable, ReasonModelListTooLarge, ReasonUpstreamResponseRefused:
		return http.StatusBadGateway
	}
	return http.StatusForbidden
}

// Event kinds.
const (
	// EventAccept is one accepted connection.
	EventAccept = "accept"
	// EventRefuse is one refused connection or request.
	EventRefuse = "refuse"
)

// Event is one accept or refusal, for the bastion's audit chain. It holds
// no secret: Detail names a method, path or model at most.
type Event struct {
	Kind   string // EventAccept or EventRefuse
	Lane   string // Kind.Lane()
	Reason string // the Reason of a refusal; "" for an accept
	Peer   string // the connection's remote address
	Detail string // what was refused (method and path, model)
}
