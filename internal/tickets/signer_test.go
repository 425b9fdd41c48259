package tickets_test

import (
	"context"
	"crypto/x509"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/signing"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/tickets"
)

// noBatches approves no batch (the signer needs a quorum gate).
type noBatches struct{}

func (noBatches) Approved(context.Context, string) (bool, error) { return false, nil }

// newSigner returns a worker signer on a fresh SQLite database with a new
// PKI bundle, its clock at now.
func newSigner(t *testing.T, now time.Time) (*signing.Signer, *pki.Bundle) {
	t.Helper()
	kek, err := pki.CreateKEK(filepath.Join(t.TempDir(), "kek"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := pki.Init(filepath.Join(t.TempDir(), "pki"), "tickets.bc.local", kek, clock.NewFake(now.Add(-48*time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	rk, err := b.CommandRootKey(kek)
	if err != nil {
		t.Fatal(err)
	}
	db := storetest.NewTestSQLite(t)
	return signing.New(signing.Deps{DB: db, Commands: commands.NewStore(db), Clock: clock.NewFake(now), KEK: kek, Root: b.CommandRoot, RootKey: rk,
		TrustDomain: b.TrustDomain, Bus: bus.New(), Batches: noBatches{}, Log: slog.New(slog.DiscardHandler)}), b
}

// TestSignerTicketVerifies checks the workers' side: SignTicket's ticket
// verifies under the bundle's command root and comes back as the body
// signed; under another bundle's root it is untrusted; its encoding is
// deterministic and well under MaxSize.
func TestSignerTicketVerifies(t *testing.T) {
	now := time.Now()
	s, b := newSigner(t, now)
	ctx := context.Background()
	in := &nodev1.TicketBody{Jti: "tk_signed", NodeId: nodeA, Port: 22, Action: tickets.ActionNodeTunnel, TenantId: "t_tenant",
		Caller: "identity/alice", IssuedAtMs: now.UnixMilli(), ExpiresAtMs: now.Add(tickets.Lifetime).UnixMilli()}
	st, err := s.SignTicket(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := proto.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) > tickets.MaxSize/2 {
		t.Fatalf("a signed ticket is %d bytes, too close to MaxSize %d", len(raw), tickets.MaxSize)
	}
	if det := marshal(t, in); string(det) != string(st.Body) {
		t.Fatal("the signed body is not the deterministic encoding")
	}
	got, r := tickets.Verify(raw, []*x509.Certificate{b.CommandRoot}, b.TrustDomain, now, want())
	if r != "" || !proto.Equal(got, in) {
		t.Fatalf("signer's ticket: %v %q, want accepted as signed", got, r)
	}
	_, other := newSigner(t, now)
	if _, r := tickets.Verify(raw, []*x509.Certificate{other.CommandRoot}, b.TrustDomain, now, want()); r != tickets.ReasonSignerUntrusted {
		t.Fatalf("under another deployment's root: %q, want %q", r, tickets.ReasonSignerUntrusted)
	}
	if _, err := s.SignTicket(ctx, nil); err == nil {
		t.Fatal("signed a nil body")
	}
}
