package signing

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// SignDesiredState signs a node's desired state with the current worker
// key, as a ticket is signed: the body marshalled deterministically,
// Ed25519 over wire.DesiredStateSigContext || body, the worker certificate
// attached. The signer stamps the trust domain and the issue time (its
// clock) itself; the caller fills the node, generation and host section
// from the nodes module. A ticket signer (NewTicketSigner) signs them too:
// it needs only the stored worker key.
func (s *Signer) SignDesiredState(ctx context.Context, body *nodev1.DesiredState) (*nodev1.SignedDesiredState, error) {
	if body == nil {
		return nil, errors.New("signing: no desired state body")
	}
	k, err := s.currentKey(ctx)
	if err != nil {
		return nil, err
	}
	b := proto.Clone(body).(*nodev1.DesiredState)
	b.TrustDomain, b.IssuedAtMs = s.trustDomain, s.clk.Now().UnixMilli()
	raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("signing: encode desired state: %w", err)
	}
	return &nodev1.SignedDesiredState{Body: raw, Signature: ed25519.Sign(k.key, append([]byte(wire.DesiredStateSigContext), raw...)), SignerCertDer: k.cert}, nil
}
