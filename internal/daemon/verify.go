package daemon

import (
	"crypto/ed25519"
	"crypto/x509"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// Reasons bcd reports when it refuses a command (state cancelled). They are
// part of the API: tests and operators match on them.
const (
	ReasonSignatureMissing = "signature-missing"
	ReasonBodyMalformed    = "body-malformed"
	ReasonSignerUntrusted  = "signer-untrusted"
	ReasonSignatureInvalid = "signature-invalid"
	ReasonIDMismatch       = "id-mismatch"
	ReasonWrongNode        = "wrong-node"
	ReasonExpired          = "expired"
	ReasonNotYetValid      = "not-yet-valid"
	ReasonReplayed         = "replayed"
	ReasonKindNotAllowed   = "kind-not-allowed"
	ReasonClockRewound     = "welcome-time-rewound"
)

// Freshness bounds: a body may be issued at most MaxSkew in the future of
// the node's clock and live at most MaxLifetime.
const (
	MaxSkew     = 5 * time.Minute
	MaxLifetime = 24 * time.Hour
)

// Verifier checks signed commands against what this node pinned at join.
type Verifier struct {
	NodeID       string
	Role         string
	TrustDomain  string
	CommandRoots []*x509.Certificate
}

// Check verifies a signed command at time now and returns its body, or the
// reason it is refused. allowed narrows the role's kinds (nil: no
// narrowing); seen reports a replayed id. The order matters: nothing in
// the body is trusted before the signature and its chain verify.
func (v *Verifier) Check(c *nodev1.SignedCommand, now time.Time, allowed []string, seen func(string) bool) (*nodev1.CommandBody, string) {
	if len(c.GetSignature()) == 0 || len(c.GetSignerCertDer()) == 0 {
		return nil, ReasonSignatureMissing
	}
	var body nodev1.CommandBody
	if err := proto.Unmarshal(c.GetBody(), &body); err != nil {
		return nil, ReasonBodyMalformed
	}
	issued := time.UnixMilli(body.IssuedAtMs)
	pub, err := pki.VerifyWorkerChain(c.SignerCertDer, v.CommandRoots, v.TrustDomain, issued)
	if err != nil {
		return nil, ReasonSignerUntrusted
	}
	if !ed25519.Verify(pub, append([]byte(wire.CommandSigContext), c.Body...), c.Signature) {
		return nil, ReasonSignatureInvalid
	}
	// From here on the body is the worker's word.
	switch {
	case body.CommandId != c.Id:
		return &body, ReasonIDMismatch
	case body.NodeId != v.NodeID:
		return &body, ReasonWrongNode
	case body.IssuedAtMs > now.Add(MaxSkew).UnixMilli():
		return &body, ReasonNotYetValid
	case body.ExpiresAtMs <= now.UnixMilli(), body.ExpiresAtMs-body.IssuedAtMs > MaxLifetime.Milliseconds():
		return &body, ReasonExpired
	case seen(body.CommandId):
		return &body, ReasonReplayed
	case !permitted(v.Role, allowed, body.Kind):
		return &body, ReasonKindNotAllowed
	}
	return &body, ""
}

func permitted(role string, allowed []string, kind string) bool {
	if !kinds.AllowedForRole(role, kind) {
		return false
	}
	if allowed == nil {
		return true
	}
	for _, k := range allowed {
		if k == kind {
			return true
		}
	}
	return false
}
