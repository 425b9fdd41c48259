package signing

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/tickets"
)

// SignTicket signs a ticket body with the current worker key, exactly as a
// time statement is signed: the body marshalled deterministically,
// Ed25519 over tickets.SigContext || body, the worker certificate
// attached. The caller (tunnels.open, after IAM decided) fills every field
// of body; the signer checks none of them, and the verifiers
// (tickets.Verifier) refuse a body that is malformed, too long-lived or
// for anything else than they expect.
func (s *Signer) SignTicket(ctx context.Context, body *nodev1.TicketBody) (*nodev1.SignedTicket, error) {
	if body == nil {
		return nil, errors.New("signing: no ticket body")
	}
	k, err := s.currentKey(ctx)
	if err != nil {
		return nil, err
	}
	raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("signing: encode ticket: %w", err)
	}
	return &nodev1.SignedTicket{Body: raw, Signature: ed25519.Sign(k.key, append([]byte(tickets.SigContext), raw...)), SignerCertDer: k.cert}, nil
}
