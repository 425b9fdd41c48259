// Package tickets verifies the tickets that open interactive streams (a
// tunnel to a port of a node, a shell in a sandbox). tunnels.open decides
// the caller with IAM and has the workers sign a ticket (signing.SignTicket):
// single use, valid Lifetime, for one node, one port and one action. The
// gateway and bcd each verify it again here, spend its jti (a Spent store:
// the database one in tickets/spentdb for the gateways, Memory for bcd) and
// refuse anything else with a precise Reason.
//
// A ticket is signed exactly as a time statement is: Ed25519 by the
// current worker key over SigContext || body, the worker certificate
// attached, which must chain to the pinned command-signing roots. Nothing
// in the body is read before that signature and chain verify.
//
// The package imports no database code, so bcd can use it without linking
// the database drivers.
package tickets

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// SigContext prefixes the bytes a worker signs for a ticket:
// Ed25519(worker key, SigContext || body). It differs from the command and
// time contexts (internal/commands/wire), so a ticket's signature never
// passes as a command's or a time statement's, nor theirs as a ticket's.
const SigContext = "bc-ticket-v1\x00"

// Bounds of a ticket.
const (
	// Lifetime is how long a ticket is valid after it is issued; a body
	// whose expiry is further than this from its issue time is refused.
	Lifetime = 60 * time.Second
	// MaxSkew is how far in the future of the verifier's clock a ticket's
	// issue time may be (the workers' and the verifier's clocks differ a
	// little). It also keeps a spent jti that long past its expiry (see
	// Retention).
	MaxSkew = 30 * time.Second
	// Retention is how long after its expiry a spent jti is kept: the
	// ticket's expiry plus MaxSkew, so a verifier whose clock is up to
	// MaxSkew behind the store's still finds it spent.
	Retention = MaxSkew
	// MaxSize bounds the marshalled SignedTicket a verifier parses. A
	// genuine one is under 1 KiB (a body of a few ids, a 64-byte signature
	// and a worker certificate of about 500 bytes).
	MaxSize = 4 << 10
	// MaxJTI bounds the jti, which the spent stores keep as a key.
	MaxJTI = 128
	// MaxArgv and MaxArg bound an exec's program: its arguments and each
	// one's bytes (the whole ticket stays under MaxSize).
	MaxArgv = 32
	MaxArg  = 256
)

// The actions a ticket may carry: the IAM actions tunnels.open decides.
const (
	// ActionNodeTunnel opens a tunnel to a port on a node's loopback.
	ActionNodeTunnel = "compute:nodes:tunnel"
	// ActionSandboxExec runs an interactive process in a sandbox.
	ActionSandboxExec = "compute:sandboxes:exec"
	// ActionSandboxPreview carries a preview request's bytes to one port
	// inside one sandbox (the preview proxy asks for it after the preview
	// token verified; sandboxes.preview decided it).
	ActionSandboxPreview = "compute:sandboxes:preview"
)

// allowedActions is every action a ticket may carry.
var allowedActions = []string{ActionNodeTunnel, ActionSandboxExec, ActionSandboxPreview}

// AllowedAction reports whether a ticket may carry action at all.
func AllowedAction(action string) bool { return slices.Contains(allowedActions, action) }

// Reason says why a ticket is refused; "" means accepted. The values are
// part of the API: callers, tests and operators match on them.
type Reason string

// The reasons a ticket is refused, each for exactly one check.
const (
	// ReasonOversized: the marshalled ticket is over MaxSize (refused
	// before parsing).
	ReasonOversized Reason = "ticket-oversized"
	// ReasonMalformed: not a SignedTicket, no signature or signer
	// certificate, or a signed body that does not parse or has an empty
	// or over-long jti, an empty node, tenant or caller, a tunnel with a
	// port outside 1 to 65535 or a program, an exec without a sandbox or a
	// valid program or with a port, or an expiry not after its issue.
	ReasonMalformed Reason = "ticket-malformed"
	// ReasonSignerUntrusted: the signer certificate does not chain to the
	// command-signing roots in the trust domain now (another CA, expired,
	// not a worker certificate).
	ReasonSignerUntrusted Reason = "ticket-signer-untrusted"
	// ReasonSignatureInvalid: the signature does not verify over
	// SigContext || body under the signer's key.
	ReasonSignatureInvalid Reason = "ticket-signature-invalid"
	// ReasonLifetimeTooLong: the body's expiry is more than Lifetime after
	// its issue time.
	ReasonLifetimeTooLong Reason = "ticket-lifetime-too-long"
	// ReasonNotYetValid: issued more than MaxSkew in the future.
	ReasonNotYetValid Reason = "ticket-not-yet-valid"
	// ReasonExpired: the expiry is at or before now.
	ReasonExpired Reason = "ticket-expired"
	// ReasonWrongNode: the ticket is for another node.
	ReasonWrongNode Reason = "ticket-wrong-node"
	// ReasonWrongPort: the ticket is for another port.
	ReasonWrongPort Reason = "ticket-wrong-port"
	// ReasonWrongSandbox: the ticket is for another sandbox (or for one,
	// where none is wanted, or none where one is).
	ReasonWrongSandbox Reason = "ticket-wrong-sandbox"
	// ReasonUnexpectedAction: the action is not one a ticket may carry, or
	// not one the verifier wants.
	ReasonUnexpectedAction Reason = "ticket-unexpected-action"
	// ReasonSpent: the jti was spent before (a replayed ticket).
	ReasonSpent Reason = "ticket-spent"
	// ReasonSpentStoreFull: the spent store holds as many unexpired jtis
	// as it may; the ticket is refused rather than not recorded.
	ReasonSpentStoreFull Reason = "ticket-spent-store-full"
	// ReasonSpendFailed: the spent store could not record the jti (a
	// database error); the ticket is refused rather than not recorded.
	ReasonSpendFailed Reason = "ticket-spend-failed"
)

// Want is what the verifier expects a ticket to be for. A zero field never
// matches a valid ticket, so an unset Want accepts nothing.
type Want struct {
	// NodeID is the node the stream goes to (bcd: itself).
	NodeID string
	// Port is the port the stream goes to.
	Port uint32
	// Ports, when not empty, replaces Port: the ticket's port must be one
	// of them (bcd's tunnel allow list, where the ticket itself says which
	// port the client wants).
	Ports []uint32
	// SandboxID is the sandbox the stream goes into; empty for a node
	// tunnel, and then the ticket must name none either.
	SandboxID string
	// Actions are the actions the verifier accepts for this stream (each
	// must also be an allowed action).
	Actions []string
}

// Verifier checks tickets against the pinned command-signing roots.
type Verifier struct {
	// Roots returns the command-signing roots in force (a trust-bundle
	// refresh may change them).
	Roots func() []*x509.Certificate
	// TrustDomain is the deployment's; the signer certificate must be a
	// worker certificate in it.
	TrustDomain string
	// WorkerChains, when set, memoises the signer chain's verification
	// (every ticket a worker key signs carries the same certificate); it
	// answers exactly as pki.VerifyWorkerChain. Nil verifies in full.
	WorkerChains *pki.WorkerChainCache
}

// Verify checks raw, a marshalled SignedTicket, at now against roots and
// trustDomain, with no memo, and returns its body or why it is refused.
// It does not spend the jti: see Verifier.Redeem.
func Verify(raw []byte, roots []*x509.Certificate, trustDomain string, now time.Time, want Want) (*nodev1.TicketBody, Reason) {
	v := Verifier{Roots: func() []*x509.Certificate { return roots }, TrustDomain: trustDomain}
	return v.Verify(raw, now, want)
}

// Verify checks raw, a marshalled SignedTicket, at now and returns its
// body, or nil and why it is refused. Its size is checked before any
// parsing. It does not spend the jti: see Redeem.
func (v *Verifier) Verify(raw []byte, now time.Time, want Want) (*nodev1.TicketBody, Reason) {
	if len(raw) > MaxSize {
		return nil, ReasonOversized
	}
	var t nodev1.SignedTicket
	if err := proto.Unmarshal(raw, &t); err != nil {
		return nil, ReasonMalformed
	}
	return v.VerifySigned(&t, now, want)
}

// VerifySigned is Verify for a ticket already parsed (one carried inside
// another message); its marshalled size is checked all the same.
func (v *Verifier) VerifySigned(t *nodev1.SignedTicket, now time.Time, want Want) (*nodev1.TicketBody, Reason) {
	if proto.Size(t) > MaxSize {
		return nil, ReasonOversized
	}
	if len(t.GetSignature()) == 0 || len(t.GetSignerCertDer()) == 0 || len(t.GetBody()) == 0 {
		return nil, ReasonMalformed
	}
	// The chain is verified at the verifier's own time, not the ticket's
	// issue time: a ticket lives a minute and worker keys rotate with
	// hours left, so a genuine signer is always valid now, and an expired
	// worker key can sign nothing that passes, whatever time it claims.
	pub, err := v.workerKey(t.SignerCertDer, now)
	if err != nil {
		return nil, ReasonSignerUntrusted
	}
	if !ed25519.Verify(pub, append([]byte(SigContext), t.Body...), t.Signature) {
		return nil, ReasonSignatureInvalid
	}
	// From here on the body is the worker's word.
	var body nodev1.TicketBody
	if err := proto.Unmarshal(t.Body, &body); err != nil {
		return nil, ReasonMalformed
	}
	if r := checkBody(&body, now, want); r != "" {
		return nil, r
	}
	return &body, ""
}

// workerKey verifies the signer certificate at time at, through the memo
// when there is one.
func (v *Verifier) workerKey(der []byte, at time.Time) (ed25519.PublicKey, error) {
	var roots []*x509.Certificate
	if v.Roots != nil {
		roots = v.Roots()
	}
	return v.WorkerChains.Verify(der, roots, v.TrustDomain, at)
}

// wellFormed reports whether an authenticated body has every field a
// ticket needs, each in range.
func wellFormed(b *nodev1.TicketBody) bool {
	switch {
	case b.Jti == "", len(b.Jti) > MaxJTI, b.NodeId == "", b.TenantId == "", b.Caller == "", b.Action == "":
		return false
	case b.IssuedAtMs <= 0, b.ExpiresAtMs <= b.IssuedAtMs:
		// Checked for every action (an exec or preview case below ends
		// the switch).
		return false
	case b.Action == ActionSandboxExec:
		// An exec: a sandbox and a program, no port.
		if b.SandboxId == "" || b.Port != 0 || !ValidArgv(b.Argv) {
			return false
		}
	case b.Action == ActionSandboxPreview:
		// A preview: a sandbox and a port, no program.
		if b.SandboxId == "" || b.Port == 0 || b.Port > 65535 || len(b.Argv) > 0 {
			return false
		}
	case b.Port == 0, b.Port > 65535, len(b.Argv) > 0:
		// A tunnel: a port, no program.
		return false
	}
	return true
}

// ValidArgv reports whether argv is a program to exec: 1 to MaxArgv
// arguments, the first non-empty, each at most MaxArg bytes without NUL.
func ValidArgv(argv []string) bool {
	if len(argv) == 0 || len(argv) > MaxArgv || argv[0] == "" {
		return false
	}
	for _, a := range argv {
		if len(a) > MaxArg || strings.ContainsRune(a, 0) {
			return false
		}
	}
	return true
}

// checkBody checks an authenticated body against now and want.
func checkBody(b *nodev1.TicketBody, now time.Time, want Want) Reason {
	switch {
	case !wellFormed(b):
		return ReasonMalformed
	case b.ExpiresAtMs-b.IssuedAtMs > Lifetime.Milliseconds():
		return ReasonLifetimeTooLong
	case b.IssuedAtMs > now.Add(MaxSkew).UnixMilli():
		return ReasonNotYetValid
	case b.ExpiresAtMs <= now.UnixMilli():
		return ReasonExpired
	case b.NodeId != want.NodeID:
		return ReasonWrongNode
	case len(want.Ports) == 0 && b.Port != want.Port, len(want.Ports) > 0 && !slices.Contains(want.Ports, b.Port):
		return ReasonWrongPort
	case b.SandboxId != want.SandboxID:
		return ReasonWrongSandbox
	case !AllowedAction(b.Action), !slices.Contains(want.Actions, b.Action):
		return ReasonUnexpectedAction
	}
	return ""
}

// Spent records spent jtis. Spend records jti, which a ticket valid until
// expires carries, and returns ErrSpent when it was recorded before; any
// other error means it could not be recorded, and the ticket must be
// refused (fail closed).
type Spent interface {
	Spend(ctx context.Context, jti string, expires time.Time) error
}

// Errors of a Spent store.
var (
	// ErrSpent: the jti was spent before.
	ErrSpent = errors.New("tickets: ticket already used")
	// ErrFull: the store holds as many unexpired jtis as it may.
	ErrFull = errors.New("tickets: spent-ticket store full")
)

// Redeem verifies raw as Verify does and, only when it passes, spends its
// jti in spent: a ticket is accepted at most once by the verifiers that
// share spent. A refused ticket spends nothing (a ticket for another node
// stays usable on its own node).
func (v *Verifier) Redeem(ctx context.Context, raw []byte, now time.Time, want Want, spent Spent) (*nodev1.TicketBody, Reason) {
	body, r := v.Verify(raw, now, want)
	if r != "" {
		return nil, r
	}
	return spend(ctx, body, spent)
}

// RedeemSigned is Redeem for a ticket already parsed.
func (v *Verifier) RedeemSigned(ctx context.Context, t *nodev1.SignedTicket, now time.Time, want Want, spent Spent) (*nodev1.TicketBody, Reason) {
	body, r := v.VerifySigned(t, now, want)
	if r != "" {
		return nil, r
	}
	return spend(ctx, body, spent)
}

// spend spends a verified body's jti and maps the store's answer to a
// reason; every error refuses.
func spend(ctx context.Context, body *nodev1.TicketBody, spent Spent) (*nodev1.TicketBody, Reason) {
	if spent == nil {
		return nil, ReasonSpendFailed
	}
	switch err := spent.Spend(ctx, body.Jti, time.UnixMilli(body.ExpiresAtMs)); {
	case err == nil:
		return body, ""
	case errors.Is(err, ErrSpent):
		return nil, ReasonSpent
	case errors.Is(err, ErrFull):
		return nil, ReasonSpentStoreFull
	default:
		return nil, ReasonSpendFailed
	}
}

// Err returns the refusal as a coded error for a caller, with a safe
// message naming the reason (never the ticket's contents), or nil for "".
func (r Reason) Err() error {
	var code errs.Code
	switch r {
	case "":
		return nil
	case ReasonOversized:
		code = errs.PayloadTooLarge
	case ReasonMalformed:
		code = errs.InvalidInput
	case ReasonSpentStoreFull:
		code = errs.ResourceExhausted
	case ReasonSpendFailed:
		code = errs.Unavailable
	default:
		code = errs.AccessDenied
	}
	return errs.New(code, "ticket refused: "+string(r))
}
