package signing

import (
	"context"
	"crypto/ed25519"
	"errors"

	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/revocations/revwire"
)

// SignRevocation signs a revocation-feed entry's body with the current
// worker key, as a ticket is signed: the body marshalled
// deterministically, Ed25519 over revwire.SigContext || body, the worker
// certificate attached. The feed (revocations.Feed.SignPending) fills the
// body; nodes verify it (revwire.Verifier).
func (s *Signer) SignRevocation(ctx context.Context, body *nodev1.RevocationBody) (*nodev1.SignedRevocation, error) {
	if body == nil {
		return nil, errors.New("signing: no revocation body")
	}
	k, err := s.currentKey(ctx)
	if err != nil {
		return nil, err
	}
	raw, err := revwire.Marshal(body)
	if err != nil {
		return nil, err
	}
	return &nodev1.SignedRevocation{Body: raw, Signature: ed25519.Sign(k.key, append([]byte(revwire.SigContext), raw...)), SignerCertDer: k.cert}, nil
}
