// Package revwire is the revocation feed's wire vocabulary, shared by the
// control plane (internal/revocations, the gateway) and bcd: the kinds of
// entry, the entry as a follower sees it, the signed body, and the node's
// verification of a signed entry against its pinned command-signing roots.
//
// An entry is signed exactly as a ticket or a time statement is: Ed25519
// by the current worker key over SigContext || body (the RevocationBody
// marshalled deterministically), the worker certificate attached, which
// must chain to the pinned command-signing roots. Nothing in the body is
// read before that signature and chain verify.
//
// The package imports no database code, so bcd links no driver through it.
package revwire

import (
	"crypto/ed25519"
	"crypto/x509"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// SigContext prefixes the bytes a worker signs for a feed entry. It
// differs from the command, time and ticket contexts, so an entry's
// signature never passes as theirs, nor theirs as an entry's.
const SigContext = "bc-revocation-v1\x00"

// The kinds of entry.
const (
	KindNodeCert = "node-cert" // subject: the node certificate's serial (hex); node set
	KindSSHCert  = "ssh-cert"  // subject: the SSH certificate's serial (decimal); node set
	KindAPIKey   = "api-key"   // subject: the key id
	KindSession  = "session"   // subject: the session id
	KindIdentity = "identity"  // subject: the identity id
	KindTicket   = "ticket"    // subject: the ticket's jti; node set
)

// ForNode reports whether entries of kind are relayed to the node they
// name: only those that change what the node itself accepts (an SSH
// certificate into its KRL, a ticket's jti into its spent store). A node
// certificate's entry closes the node's own session, which the gateway
// does; credentials are the API's business and name no node.
func ForNode(kind string) bool { return kind == KindSSHCert || kind == KindTicket }

// NodeWindow is how far back a gateway looks for a node's entries when
// the node's session opens: an entry older than this can only name an
// SSH certificate (at most an hour, sshca.MaxValidity) or a ticket (60 s)
// that has expired by now, which the node refuses anyway. NodeWindowMax
// bounds how many it sends.
const (
	NodeWindow    = time.Hour + 5*time.Minute
	NodeWindowMax = 1024
)

// Bounds of an entry.
const (
	// MaxSize bounds a marshalled SignedRevocation a node parses. A
	// genuine one is under 1 KiB (a few ids, a 64-byte signature and a
	// worker certificate of about 500 bytes).
	MaxSize = 4 << 10
	// MaxBatch bounds the entries of one Revocations message a node takes.
	MaxBatch = NodeWindowMax
	// MaxField bounds each string field of a body.
	MaxField = 256
)

// Entry is one entry of the feed as a follower reads it. Signed is nil
// until a worker signed it.
type Entry struct {
	Seq        int64
	Kind       string
	Subject    string
	TenantID   string
	NodeID     string
	At         time.Time
	Reason     string
	Generation uint64
	Signed     *nodev1.SignedRevocation
}

// Body is the body a worker signs for e in deployment and trustDomain.
func Body(e Entry, deployment, trustDomain string) *nodev1.RevocationBody {
	return &nodev1.RevocationBody{Deployment: deployment, TrustDomain: trustDomain, Seq: e.Seq, Kind: e.Kind, Subject: e.Subject,
		TenantId: e.TenantID, NodeId: e.NodeID, AtMs: e.At.UnixMilli(), Reason: e.Reason, Generation: e.Generation}
}

// Marshal encodes b deterministically: the bytes a worker signs.
func Marshal(b *nodev1.RevocationBody) ([]byte, error) {
	raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("revwire: encode body: %w", err)
	}
	return raw, nil
}

// Reason says why a node refuses an entry; "" means accepted. The values
// are logged and counted by the node, and tests match on them.
type Reason string

// The reasons an entry is refused, each for exactly one check.
const (
	ReasonOversized        Reason = "revocation-oversized"
	ReasonMalformed        Reason = "revocation-malformed"
	ReasonSignerUntrusted  Reason = "revocation-signer-untrusted"
	ReasonSignatureInvalid Reason = "revocation-signature-invalid"
	ReasonOtherDeployment  Reason = "revocation-other-deployment"
	ReasonOtherNode        Reason = "revocation-other-node"
	ReasonUnexpectedKind   Reason = "revocation-unexpected-kind"
)

// Verifier checks signed entries against the pinned command-signing roots.
type Verifier struct {
	// Roots returns the command-signing roots in force.
	Roots func() []*x509.Certificate
	// TrustDomain and Deployment are the pinned bundle's; an entry of
	// another is refused.
	TrustDomain, Deployment string
	// NodeID is the node verifying: an entry must name it.
	NodeID string
	// WorkerChains memoises signer chains (nil: verify in full).
	WorkerChains *pki.WorkerChainCache
}

// Verify checks raw, a marshalled SignedRevocation, at now.
func (v *Verifier) Verify(raw []byte, now time.Time) (*nodev1.RevocationBody, Reason) {
	if len(raw) > MaxSize {
		return nil, ReasonOversized
	}
	var s nodev1.SignedRevocation
	if err := proto.Unmarshal(raw, &s); err != nil {
		return nil, ReasonMalformed
	}
	return v.VerifySigned(&s, now)
}

// VerifySigned checks a parsed entry at now: its size, the signer's chain
// to the roots at now (a worker key rotates with hours left, and a node
// takes only entries of the last NodeWindow), the signature over
// SigContext || body, then the body: well formed, this deployment and
// trust domain, this node, and a kind relayed to nodes.
func (v *Verifier) VerifySigned(s *nodev1.SignedRevocation, now time.Time) (*nodev1.RevocationBody, Reason) {
	if proto.Size(s) > MaxSize {
		return nil, ReasonOversized
	}
	if len(s.GetBody()) == 0 || len(s.GetSignature()) == 0 || len(s.GetSignerCertDer()) == 0 {
		return nil, ReasonMalformed
	}
	pub, err := v.workerKey(s.SignerCertDer, now)
	if err != nil {
		return nil, ReasonSignerUntrusted
	}
	if !ed25519.Verify(pub, append([]byte(SigContext), s.Body...), s.Signature) {
		return nil, ReasonSignatureInvalid
	}
	var b nodev1.RevocationBody
	if err := proto.Unmarshal(s.Body, &b); err != nil || !wellFormed(&b) {
		return nil, ReasonMalformed
	}
	switch {
	case b.Deployment != v.Deployment || b.TrustDomain != v.TrustDomain:
		return nil, ReasonOtherDeployment
	case b.NodeId != v.NodeID:
		return nil, ReasonOtherNode
	case !ForNode(b.Kind):
		return nil, ReasonUnexpectedKind
	}
	return &b, ""
}

func (v *Verifier) workerKey(der []byte, at time.Time) (ed25519.PublicKey, error) {
	var roots []*x509.Certificate
	if v.Roots != nil {
		roots = v.Roots()
	}
	return v.WorkerChains.Verify(der, roots, v.TrustDomain, at)
}

// wellFormed reports whether an authenticated body has every field an
// entry needs, each in range; an ssh-cert subject must be a decimal serial
// from 1 to 2^63-1.
func wellFormed(b *nodev1.RevocationBody) bool {
	for _, f := range []string{b.Deployment, b.TrustDomain, b.Kind, b.Subject, b.TenantId, b.NodeId, b.Reason} {
		if len(f) > MaxField {
			return false
		}
	}
	if b.Seq <= 0 || b.Kind == "" || b.Subject == "" || b.AtMs <= 0 {
		return false
	}
	if b.Kind == KindSSHCert {
		if _, ok := SSHSerial(b.Subject); !ok {
			return false
		}
	}
	return true
}

// SSHSerial parses an ssh-cert subject: a canonical decimal from 1 to
// 2^63-1.
func SSHSerial(subject string) (uint64, bool) {
	n, err := strconv.ParseUint(subject, 10, 63)
	if err != nil || n == 0 || strconv.FormatUint(n, 10) != subject {
		return 0, false
	}
	return n, true
}
