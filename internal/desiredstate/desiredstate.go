// Package desiredstate is the root helper's check of the node's signed
// desired state (issue 17, point 3). Every helper operation that changes
// the host carries the last desired state the node verified; the helper
// does not take the node's word for it but checks it again here, under
// command-signing roots it trusts on its own:
//
//   - the roots are the command roots of a trust bundle the node presents
//     (a marshalled nodev1.SignedTrustBundle), taken only when the bundle
//     verifies under the join key root pinned (Config.JoinKeyPin) and is
//     not older than the last one accepted (forward only), and of those
//     only the roots whose SHA-256 root pinned (Config.PinnedRootSHA256)
//     when any are pinned;
//   - the desired state's signer must be a worker certificate chained to
//     those roots at the state's issue time (pki.VerifyWorkerChain's
//     rules, as the node's daemon.Verifier), its Ed25519 signature must
//     verify under wire.DesiredStateSigContext, and it must name this node
//     and the roots' trust domain;
//   - its generation must not be older than the highest one this checker
//     ever accepted.
//
// What the checker learnt (the accepted roots and bundle time, the node
// id, the highest generation) is kept in one file in Config.StateDir,
// written atomically with mode 0600, so a restart of the helper forgets
// none of it and a later request without a bundle still verifies.
//
// It fails closed: with neither pins nor a join key configured every check
// is refused intent-untrusted, and once anything is pinned a request
// without a desired state is refused intent-missing, whether or not roots
// are held yet (a node that never presented a bundle would otherwise
// never be checked).
package desiredstate

import (
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// Config configures a Checker. Everything in it is root's own word (its
// config file, or its own signed join record), never the node's.
type Config struct {
	// PinnedRootSHA256 are the SHA-256 digests of the DER of the
	// command-signing roots the helper trusts. When any are set, only a
	// presented bundle's roots with one of these digests count.
	PinnedRootSHA256 [][32]byte
	// JoinKeyPin, when set, is the join key a presented trust bundle must
	// be signed by (its own signature or one of its other_signatures).
	// Unset, a bundle is taken unsigned, and only its pinned roots count.
	JoinKeyPin ed25519.PublicKey
	// NodeID returns this node's id when the helper knows it (from root's
	// config or a join record root verified). Nil, or returning "", means
	// trust on first use: the node id of the first desired state that
	// verifies is kept in StateDir and every later one must name it.
	NodeID func() string
	// StateDir holds the checker's state file (created 0700 if missing).
	StateDir string
	// Clock stamps what is accepted (state file); default the real clock.
	Clock clock.Clock
	// WorkerChains memoises verified worker chains; nil verifies each in
	// full (same answers either way).
	WorkerChains *pki.WorkerChainCache
}

// Checker checks signed desired states. It is safe for concurrent use:
// checks are serialised, so two requests cannot both pass a generation
// check that only one of them may.
type Checker struct {
	cfg Config

	mu sync.Mutex
	st state
}

// New loads the checker's state from cfg.StateDir. A state file that does
// not decode is an error (the helper must not start forgetting what it
// accepted); a missing one is a fresh start.
func New(cfg Config) (*Checker, error) {
	if cfg.StateDir == "" {
		return nil, errors.New("desiredstate: no state directory")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	st, err := loadState(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	return &Checker{cfg: cfg, st: st}, nil
}

// pinned reports whether root configured anything to trust at all.
func (c *Checker) pinned() bool {
	return len(c.cfg.PinnedRootSHA256) > 0 || len(c.cfg.JoinKeyPin) > 0
}

// refuse is a refusal with a code of helperwire and a safe reason (never
// the bytes checked, nor a key).
func refuse(code, reason string) *helperwire.Refusal {
	return &helperwire.Refusal{Code: code, Reason: reason}
}

// Check takes bundle (a marshalled nodev1.SignedTrustBundle, may be empty)
// forward when it is newer than the one accepted, then verifies intent (a
// marshalled nodev1.SignedDesiredState) and returns its body, recording
// its generation as applied. Every refusal is a *helperwire.Refusal with
// one of the intent-* codes or bundle-refused; an error of the state file
// is CodeFailed (the check did not happen, so nothing is allowed).
func (c *Checker) Check(intent, bundle []byte) (*nodev1.DesiredState, error) {
	if !c.pinned() {
		return nil, refuse(helperwire.CodeIntentUntrusted, "no command root pinned")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(bundle) > 0 {
		if err := c.takeBundle(bundle); err != nil {
			return nil, err
		}
	}
	if len(intent) == 0 {
		return nil, refuse(helperwire.CodeIntentMissing, "no signed desired state")
	}
	body, err := c.verify(intent)
	if err != nil {
		return nil, err
	}
	return body, c.apply(body)
}

// verify checks intent's signature and chain under the roots held, in the
// daemon's order: nothing of the body is trusted before its signer's
// chain and signature verify.
func (c *Checker) verify(intent []byte) (*nodev1.DesiredState, error) {
	var sd nodev1.SignedDesiredState
	if err := proto.Unmarshal(intent, &sd); err != nil {
		return nil, refuse(helperwire.CodeIntentMalformed, "desired state does not decode")
	}
	var body nodev1.DesiredState
	if len(sd.Signature) == 0 || len(sd.SignerCertDer) == 0 || proto.Unmarshal(sd.Body, &body) != nil || body.IssuedAtMs <= 0 {
		return nil, refuse(helperwire.CodeIntentMalformed, "desired state body does not decode or is unsigned")
	}
	roots := c.roots()
	if len(roots) == 0 {
		return nil, refuse(helperwire.CodeIntentUntrusted, "no pinned command root held yet")
	}
	pub, err := c.cfg.WorkerChains.Verify(sd.SignerCertDer, roots, c.st.TrustDomain, time.UnixMilli(body.IssuedAtMs))
	if err != nil {
		return nil, refuse(helperwire.CodeIntentUntrusted, "signer is not a worker of the pinned roots")
	}
	if !ed25519.Verify(pub, append([]byte(wire.DesiredStateSigContext), sd.Body...), sd.Signature) {
		return nil, refuse(helperwire.CodeIntentSignature, "signature does not verify")
	}
	// From here on the body is a worker's word.
	if body.TrustDomain != c.st.TrustDomain {
		return nil, refuse(helperwire.CodeIntentUntrusted, "desired state of another trust domain")
	}
	return &body, nil
}

// apply checks the verified body's node and generation against what the
// checker holds and records them (node id on first use, the generation
// when higher).
func (c *Checker) apply(body *nodev1.DesiredState) error {
	want := c.st.NodeID
	if c.cfg.NodeID != nil {
		if id := c.cfg.NodeID(); id != "" {
			want = id
		}
	}
	if want != "" && body.NodeId != want {
		return refuse(helperwire.CodeIntentOtherNode, "desired state names another node")
	}
	if body.NodeId == "" {
		return refuse(helperwire.CodeIntentOtherNode, "desired state names no node")
	}
	if body.Generation < c.st.Generation {
		return refuse(helperwire.CodeIntentRewound, fmt.Sprintf("generation %d is older than %d", body.Generation, c.st.Generation))
	}
	if body.Generation == c.st.Generation && c.st.NodeID == body.NodeId {
		return nil
	}
	next := c.st
	next.NodeID, next.Generation, next.AppliedAtMs = body.NodeId, body.Generation, c.cfg.Clock.Now().UnixMilli()
	return c.save(next)
}

// roots returns the accepted roots that are pinned now (a pin removed from
// root's config stops counting at once, even for a bundle accepted
// before).
func (c *Checker) roots() []*x509.Certificate {
	var out []*x509.Certificate
	for _, der := range c.st.Roots {
		if !c.rootPinned(der) {
			continue
		}
		if cert, err := x509.ParseCertificate(der); err == nil {
			out = append(out, cert)
		}
	}
	return out
}

// rootPinned reports whether der counts as a root: pinned by digest, or
// any root when no digest is pinned (then the join key vouched for it).
func (c *Checker) rootPinned(der []byte) bool {
	if len(c.cfg.PinnedRootSHA256) == 0 {
		return len(c.cfg.JoinKeyPin) > 0
	}
	sum := sha256.Sum256(der)
	for _, p := range c.cfg.PinnedRootSHA256 {
		if p == sum {
			return true
		}
	}
	return false
}

// save writes next to the state file and, once it is durable, holds it.
func (c *Checker) save(next state) error {
	if err := saveState(c.cfg.StateDir, next); err != nil {
		return refuse(helperwire.CodeFailed, "state not saved")
	}
	c.st = next
	return nil
}

// Roots returns the command-signing roots the checker holds that count
// now (pinned, or vouched for by the pinned join key): what the helper
// checks a signed command's signer against.
func (c *Checker) Roots() []*x509.Certificate {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.roots()
}

// NodeID returns the node this checker serves: root's configured id, else
// the one it learnt from the first desired state that verified ("" before).
func (c *Checker) NodeID() string {
	if c.cfg.NodeID != nil {
		if id := c.cfg.NodeID(); id != "" {
			return id
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.st.NodeID
}
