package desiredstate

import (
	"crypto/ed25519"
	"crypto/subtle"
	"errors"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// takeBundle checks a presented trust bundle and, when it is newer than
// the one accepted, takes its pinned command roots (forward only). The
// same bundle again, or one issued at the same second, changes nothing;
// an older one, one not signed by the pinned join key, one for another
// trust domain, or a newer one without a pinned root is refused
// bundle-refused and the roots held stay.
func (c *Checker) takeBundle(raw []byte) error {
	tb, err := c.openBundle(raw)
	if err != nil {
		return refuse(helperwire.CodeBundle, "trust bundle does not verify under the pinned join key")
	}
	switch {
	case tb.IssuedAt < c.st.BundleIssuedAt:
		return refuse(helperwire.CodeBundle, "trust bundle is older than the one accepted")
	case tb.IssuedAt == c.st.BundleIssuedAt && len(c.st.Roots) > 0:
		return nil
	case c.st.TrustDomain != "" && tb.TrustDomain != c.st.TrustDomain:
		return refuse(helperwire.CodeBundle, "trust bundle of another trust domain")
	}
	var roots [][]byte
	for _, der := range tb.CommandRoots {
		if c.rootPinned(der) {
			roots = append(roots, der)
		}
	}
	if len(roots) == 0 {
		return refuse(helperwire.CodeBundle, "trust bundle holds no pinned command root")
	}
	next := c.st
	next.TrustDomain, next.BundleIssuedAt, next.Roots = tb.TrustDomain, tb.IssuedAt, roots
	next.BundleAtMs = c.cfg.Clock.Now().UnixMilli()
	return c.save(next)
}

// openBundle decodes a marshalled SignedTrustBundle and verifies its body
// under the pinned join key (its main signature or one of the others).
// Without a join key pinned the body is only decoded (strictly): its roots
// then count only by their pinned digests.
func (c *Checker) openBundle(raw []byte) (pki.TrustBundle, error) {
	var sb nodev1.SignedTrustBundle
	if err := proto.Unmarshal(raw, &sb); err != nil {
		return pki.TrustBundle{}, err
	}
	if len(c.cfg.JoinKeyPin) == 0 {
		return pki.DecodeTrustBundle(sb.Body)
	}
	pin := pki.JoinKeyPin(c.cfg.JoinKeyPin)
	sigs := []*nodev1.JoinKeySignature{{JoinPublicKey: sb.JoinPublicKey, Signature: sb.Signature}}
	sigs = append(sigs, sb.OtherSignatures...)
	for _, s := range sigs {
		if len(s.GetJoinPublicKey()) == ed25519.PublicKeySize &&
			subtle.ConstantTimeCompare(s.GetJoinPublicKey(), c.cfg.JoinKeyPin) == 1 {
			return pki.VerifyTrustBundle(sb.Body, s.GetSignature(), s.GetJoinPublicKey(), pin)
		}
	}
	return pki.TrustBundle{}, errors.New("desiredstate: no signature by the pinned join key")
}
