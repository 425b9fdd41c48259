package tickets_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/tickets"
)

// TestGenuineTicketAccepted checks the one ticket that passes: genuinely
// signed, for the wanted node, port and action, inside its minute; its
// body comes back as signed. Also at the edges: issued exactly MaxSkew
// ahead, a millisecond before expiry, and a lifetime of exactly Lifetime.
func TestGenuineTicketAccepted(t *testing.T) {
	f := newFixture(t)
	got, r := f.verifier().Verify(f.raw(t, body()), t0, want())
	if r != "" || !proto.Equal(got, body()) {
		t.Fatalf("genuine ticket: %v %q, want accepted with its body", got, r)
	}
	if _, r := tickets.Verify(f.raw(t, body()), []*x509.Certificate{f.root}, trustDomain, t0, want()); r != "" {
		t.Fatalf("package Verify: %q, want accepted", r)
	}
	edge := body()
	edge.IssuedAtMs = t0.Add(tickets.MaxSkew).UnixMilli()
	edge.ExpiresAtMs = edge.IssuedAtMs + tickets.Lifetime.Milliseconds()
	if _, r := f.verifier().Verify(f.raw(t, edge), t0, want()); r != "" {
		t.Fatalf("issued exactly MaxSkew ahead: %q, want accepted", r)
	}
	last := body()
	if _, r := f.verifier().Verify(f.raw(t, last), time.UnixMilli(last.ExpiresAtMs-1), want()); r != "" {
		t.Fatalf("a millisecond before expiry: %q, want accepted", r)
	}
	exec := body()
	exec.Action, exec.SandboxId, exec.Port, exec.Argv = tickets.ActionSandboxExec, "sb_one", 0, []string{"sh", "-l"}
	if _, r := f.verifier().Verify(f.raw(t, exec), t0, tickets.Want{NodeID: nodeA, SandboxID: "sb_one",
		Actions: []string{tickets.ActionSandboxExec}}); r != "" {
		t.Fatalf("sandbox exec ticket: %q, want accepted", r)
	}
	// The same through the worker-chain memo.
	v := f.verifier()
	v.WorkerChains = pki.NewWorkerChainCache(0)
	for i := 0; i < 2; i++ {
		if _, r := v.Verify(f.raw(t, body()), t0, want()); r != "" {
			t.Fatalf("through the memo (%d): %q", i, r)
		}
	}
}

// TestBodyRefusals checks each check on a genuinely signed body by its
// exact reason. Each case differs from the genuine ticket (or what the
// verifier wants) in one thing only, so it is accepted when that one
// check is removed.
func TestBodyRefusals(t *testing.T) {
	f := newFixture(t)
	edit := func(fn func(b *nodev1.TicketBody)) *nodev1.TicketBody { b := body(); fn(b); return b }
	for _, c := range []struct {
		name string
		body *nodev1.TicketBody
		want tickets.Want
		r    tickets.Reason
	}{
		{"empty jti", edit(func(b *nodev1.TicketBody) { b.Jti = "" }), want(), tickets.ReasonMalformed},
		{"long jti", edit(func(b *nodev1.TicketBody) { b.Jti = strings.Repeat("j", tickets.MaxJTI+1) }), want(), tickets.ReasonMalformed},
		{"empty node", edit(func(b *nodev1.TicketBody) { b.NodeId = "" }), tickets.Want{Port: 22, Actions: want().Actions}, tickets.ReasonMalformed},
		{"empty tenant", edit(func(b *nodev1.TicketBody) { b.TenantId = "" }), want(), tickets.ReasonMalformed},
		{"empty caller", edit(func(b *nodev1.TicketBody) { b.Caller = "" }), want(), tickets.ReasonMalformed},
		{"empty action", edit(func(b *nodev1.TicketBody) { b.Action = "" }), tickets.Want{NodeID: nodeA, Port: 22, Actions: []string{""}}, tickets.ReasonMalformed},
		{"port 0", edit(func(b *nodev1.TicketBody) { b.Port = 0 }), tickets.Want{NodeID: nodeA, Actions: want().Actions}, tickets.ReasonMalformed},
		{"port 65536", edit(func(b *nodev1.TicketBody) { b.Port = 65536 }), tickets.Want{NodeID: nodeA, Port: 65536, Actions: want().Actions}, tickets.ReasonMalformed},
		{"exec without sandbox", edit(func(b *nodev1.TicketBody) { b.Action, b.Port, b.Argv = tickets.ActionSandboxExec, 0, []string{"sh"} }),
			tickets.Want{NodeID: nodeA, Actions: []string{tickets.ActionSandboxExec}}, tickets.ReasonMalformed},
		{"exec with a port", edit(func(b *nodev1.TicketBody) {
			b.Action, b.SandboxId, b.Argv = tickets.ActionSandboxExec, "sb_one", []string{"sh"}
		}),
			tickets.Want{NodeID: nodeA, Port: 22, SandboxID: "sb_one", Actions: []string{tickets.ActionSandboxExec}}, tickets.ReasonMalformed},
		{"exec without a program", edit(func(b *nodev1.TicketBody) { b.Action, b.SandboxId, b.Port = tickets.ActionSandboxExec, "sb_one", 0 }),
			tickets.Want{NodeID: nodeA, SandboxID: "sb_one", Actions: []string{tickets.ActionSandboxExec}}, tickets.ReasonMalformed},
		{"exec with an argument holding NUL", edit(func(b *nodev1.TicketBody) {
			b.Action, b.SandboxId, b.Port, b.Argv = tickets.ActionSandboxExec, "sb_one", 0, []string{"sh", "a\x00b"}
		}), tickets.Want{NodeID: nodeA, SandboxID: "sb_one", Actions: []string{tickets.ActionSandboxExec}}, tickets.ReasonMalformed},
		{"tunnel with a program", edit(func(b *nodev1.TicketBody) { b.Argv = []string{"sh"} }), want(), tickets.ReasonMalformed},
		{"preview without sandbox", edit(func(b *nodev1.TicketBody) { b.Action = tickets.ActionSandboxPreview }),
			tickets.Want{NodeID: nodeA, Port: 22, Actions: []string{tickets.ActionSandboxPreview}}, tickets.ReasonMalformed},
		{"preview without a port", edit(func(b *nodev1.TicketBody) { b.Action, b.SandboxId, b.Port = tickets.ActionSandboxPreview, "sb_one", 0 }),
			tickets.Want{NodeID: nodeA, SandboxID: "sb_one", Actions: []string{tickets.ActionSandboxPreview}}, tickets.ReasonMalformed},
		{"preview with a program", edit(func(b *nodev1.TicketBody) {
			b.Action, b.SandboxId, b.Argv = tickets.ActionSandboxPreview, "sb_one", []string{"sh"}
		}), tickets.Want{NodeID: nodeA, Port: 22, SandboxID: "sb_one", Actions: []string{tickets.ActionSandboxPreview}}, tickets.ReasonMalformed},
		{"preview expiring at issue", edit(func(b *nodev1.TicketBody) {
			b.Action, b.SandboxId, b.ExpiresAtMs = tickets.ActionSandboxPreview, "sb_one", b.IssuedAtMs
		}), tickets.Want{NodeID: nodeA, Port: 22, SandboxID: "sb_one", Actions: []string{tickets.ActionSandboxPreview}}, tickets.ReasonMalformed},
		{"exec expiring at issue", edit(func(b *nodev1.TicketBody) {
			b.Action, b.SandboxId, b.Port, b.Argv, b.ExpiresAtMs = tickets.ActionSandboxExec, "sb_one", 0, []string{"sh"}, b.IssuedAtMs
		}), tickets.Want{NodeID: nodeA, SandboxID: "sb_one", Actions: []string{tickets.ActionSandboxExec}}, tickets.ReasonMalformed},
		{"preview ticket where exec is wanted", edit(func(b *nodev1.TicketBody) { b.Action, b.SandboxId = tickets.ActionSandboxPreview, "sb_one" }),
			tickets.Want{NodeID: nodeA, Port: 22, SandboxID: "sb_one", Actions: []string{tickets.ActionSandboxExec}}, tickets.ReasonUnexpectedAction},
		{"issued at 0", edit(func(b *nodev1.TicketBody) { b.IssuedAtMs = 0 }), want(), tickets.ReasonMalformed},
		{"expires at issue", edit(func(b *nodev1.TicketBody) { b.ExpiresAtMs = b.IssuedAtMs }), want(), tickets.ReasonMalformed},
		{"lifetime over 60 s", edit(func(b *nodev1.TicketBody) { b.ExpiresAtMs = b.IssuedAtMs + tickets.Lifetime.Milliseconds() + 1 }), want(), tickets.ReasonLifetimeTooLong},
		{"issued beyond skew", edit(func(b *nodev1.TicketBody) {
			b.IssuedAtMs = t0.Add(tickets.MaxSkew).UnixMilli() + 1
			b.ExpiresAtMs = b.IssuedAtMs + tickets.Lifetime.Milliseconds()
		}), want(), tickets.ReasonNotYetValid},
		{"expired", edit(func(b *nodev1.TicketBody) {
			b.IssuedAtMs, b.ExpiresAtMs = t0.Add(-time.Minute).UnixMilli(), t0.UnixMilli()
		}), want(), tickets.ReasonExpired},
		{"wrong node", edit(func(b *nodev1.TicketBody) { b.NodeId = nodeB }), want(), tickets.ReasonWrongNode},
		{"wrong port", edit(func(b *nodev1.TicketBody) { b.Port = 8080 }), want(), tickets.ReasonWrongPort},
		{"sandbox where none is wanted", edit(func(b *nodev1.TicketBody) { b.SandboxId = "sb_one" }), want(), tickets.ReasonWrongSandbox},
		{"other sandbox", edit(func(b *nodev1.TicketBody) {
			b.Action, b.SandboxId, b.Port, b.Argv = tickets.ActionSandboxExec, "sb_two", 0, []string{"sh"}
		}), tickets.Want{NodeID: nodeA, SandboxID: "sb_one", Actions: []string{tickets.ActionSandboxExec}}, tickets.ReasonWrongSandbox},
		{"action not allowed though wanted", edit(func(b *nodev1.TicketBody) { b.Action = "compute:nodes:ssh-root" }),
			tickets.Want{NodeID: nodeA, Port: 22, Actions: []string{"compute:nodes:ssh-root"}}, tickets.ReasonUnexpectedAction},
		{"exec ticket where a tunnel is wanted", edit(func(b *nodev1.TicketBody) {
			b.Action, b.SandboxId, b.Port, b.Argv = tickets.ActionSandboxExec, "sb_one", 0, []string{"sh"}
		}), tickets.Want{NodeID: nodeA, SandboxID: "sb_one", Actions: []string{tickets.ActionNodeTunnel}}, tickets.ReasonUnexpectedAction},
		{"tunnel ticket where exec is wanted", body(),
			tickets.Want{NodeID: nodeA, Port: 22, Actions: []string{tickets.ActionSandboxExec}}, tickets.ReasonUnexpectedAction},
		{"nothing wanted", body(), tickets.Want{}, tickets.ReasonWrongNode},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, r := f.verifier().Verify(f.raw(t, c.body), t0, c.want)
			if r != c.r || got != nil {
				t.Fatalf("%v %q, want refused %q", got, r, c.r)
			}
		})
	}
}

// TestSignerRefusals checks the signer's chain and signature by their
// exact reasons: a worker certificate from another CA, expired, for
// another trust domain, or not a certificate; a signature altered, over
// altered bytes, or made under another context (a time statement's or a
// command's signature never passes as a ticket's).
func TestSignerRefusals(t *testing.T) {
	f := newFixture(t)
	otherKey := seedKey(9)
	other := newRoot(t, otherKey, "test command root") // same name, other key
	genuine := f.sign(t, body())
	with := func(fn func(st *nodev1.SignedTicket)) *nodev1.SignedTicket {
		st := proto.Clone(genuine).(*nodev1.SignedTicket)
		fn(st)
		return st
	}
	for _, c := range []struct {
		name string
		st   *nodev1.SignedTicket
		r    tickets.Reason
	}{
		{"signer from another CA", with(func(st *nodev1.SignedTicket) {
			st.SignerCertDer = f.certify(t, other, otherKey, trustDomain, t0.Add(-time.Hour), 24*time.Hour)
		}), tickets.ReasonSignerUntrusted},
		{"expired signer", with(func(st *nodev1.SignedTicket) {
			st.SignerCertDer = f.certify(t, f.root, f.rootKey, trustDomain, t0.Add(-25*time.Hour), 24*time.Hour)
		}), tickets.ReasonSignerUntrusted},
		{"signer expired since the ticket was issued", func() *nodev1.SignedTicket {
			// Valid until t0-30s (NotBefore is backdated a minute); the
			// ticket was issued at t0-40s and lives until t0+20s.
			b := body()
			b.IssuedAtMs, b.ExpiresAtMs = t0.Add(-40*time.Second).UnixMilli(), t0.Add(20*time.Second).UnixMilli()
			st := f.sign(t, b)
			st.SignerCertDer = f.certify(t, f.root, f.rootKey, trustDomain, t0.Add(-24*time.Hour-30*time.Second), 24*time.Hour)
			return st
		}(), tickets.ReasonSignerUntrusted},
		{"signer for another trust domain", with(func(st *nodev1.SignedTicket) {
			st.SignerCertDer = f.certify(t, f.root, f.rootKey, "other.bc.local", t0.Add(-time.Hour), 24*time.Hour)
		}), tickets.ReasonSignerUntrusted},
		{"signer the root itself", with(func(st *nodev1.SignedTicket) { st.SignerCertDer = f.root.Raw }), tickets.ReasonSignerUntrusted},
		{"signer not a certificate", with(func(st *nodev1.SignedTicket) { st.SignerCertDer = []byte("not a certificate") }), tickets.ReasonSignerUntrusted},
		{"signature altered", with(func(st *nodev1.SignedTicket) { st.Signature[0] ^= 1 }), tickets.ReasonSignatureInvalid},
		{"body altered", with(func(st *nodev1.SignedTicket) {
			b := body()
			b.Port = 23
			st.Body = marshal(t, b)
		}), tickets.ReasonSignatureInvalid},
		{"signed as a time statement", f.signRaw(marshal(t, body()), wire.TimeSigContext), tickets.ReasonSignatureInvalid},
		{"signed as a command", f.signRaw(marshal(t, body()), wire.CommandSigContext), tickets.ReasonSignatureInvalid},
		{"signed with no context", f.signRaw(marshal(t, body()), ""), tickets.ReasonSignatureInvalid},
		{"no signature", with(func(st *nodev1.SignedTicket) { st.Signature = nil }), tickets.ReasonMalformed},
		{"no signer", with(func(st *nodev1.SignedTicket) { st.SignerCertDer = nil }), tickets.ReasonMalformed},
		{"no body", f.signRaw(nil, tickets.SigContext), tickets.ReasonMalformed},
		{"signed body not a TicketBody", f.signRaw([]byte{0xff, 0xff, 0xff}, tickets.SigContext), tickets.ReasonMalformed},
		{"signed body with trailing junk", f.signRaw(append(marshal(t, body()), 0xff), tickets.SigContext), tickets.ReasonMalformed},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got, r := f.verifier().Verify(marshal(t, c.st), t0, want()); r != c.r || got != nil {
				t.Fatalf("%v %q, want refused %q", got, r, c.r)
			}
			if got, r := f.verifier().VerifySigned(c.st, t0, want()); r != c.r || got != nil {
				t.Fatalf("VerifySigned: %v %q, want refused %q", got, r, c.r)
			}
		})
	}
	// A verifier with no roots trusts no signer.
	v := &tickets.Verifier{TrustDomain: trustDomain}
	if _, r := v.Verify(f.raw(t, body()), t0, want()); r != tickets.ReasonSignerUntrusted {
		t.Fatalf("no roots: %q, want %q", r, tickets.ReasonSignerUntrusted)
	}
}

// TestOversizedRefusedBeforeParsing checks the size bound: a genuinely
// signed ticket, valid in every other respect, whose encoding is over
// MaxSize is refused as oversized (it would pass otherwise), and so are
// MaxSize+1 bytes that are not even a ticket (oversized, not malformed:
// the size is checked before parsing). The genuine ticket is well under
// the bound.
func TestOversizedRefusedBeforeParsing(t *testing.T) {
	f := newFixture(t)
	if n := len(f.raw(t, body())); n > tickets.MaxSize/2 {
		t.Fatalf("a genuine ticket is %d bytes, too close to MaxSize %d", n, tickets.MaxSize)
	}
	big := body()
	big.Caller = strings.Repeat("c", tickets.MaxSize)
	raw := f.raw(t, big)
	if _, r := f.verifier().Verify(raw, t0, want()); r != tickets.ReasonOversized {
		t.Fatalf("oversized genuine ticket: %q, want %q", r, tickets.ReasonOversized)
	}
	if _, r := f.verifier().VerifySigned(f.sign(t, big), t0, want()); r != tickets.ReasonOversized {
		t.Fatalf("oversized genuine ticket, parsed: %q, want %q", r, tickets.ReasonOversized)
	}
	junk := bytes.Repeat([]byte{0xff}, tickets.MaxSize+1)
	if _, r := f.verifier().Verify(junk, t0, want()); r != tickets.ReasonOversized {
		t.Fatalf("oversized junk: %q, want %q", r, tickets.ReasonOversized)
	}
	if _, r := f.verifier().Verify(junk[:tickets.MaxSize], t0, want()); r != tickets.ReasonMalformed {
		t.Fatalf("junk at the bound: %q, want %q", r, tickets.ReasonMalformed)
	}
	for _, garbage := range [][]byte{nil, {}, []byte("garbage"), {0x0a, 0xff}} {
		if _, r := f.verifier().Verify(garbage, t0, want()); r != tickets.ReasonMalformed {
			t.Fatalf("garbage %x: %q, want %q", garbage, r, tickets.ReasonMalformed)
		}
	}
}

// TestRedeemSpendsOnce checks single use with the in-memory store: the
// genuine ticket is accepted once, then refused as spent (raw and parsed
// alike); a ticket refused for another reason spends nothing (node A
// refusing node B's ticket leaves A's store empty, and B accepts it).
func TestRedeemSpendsOnce(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	m := tickets.NewMemory(clock.NewFake(t0), 0)
	v := f.verifier()
	forB := body()
	forB.NodeId = nodeB
	if _, r := v.Redeem(ctx, f.raw(t, forB), t0, want(), m); r != tickets.ReasonWrongNode {
		t.Fatalf("node A redeeming node B's ticket: %q, want %q", r, tickets.ReasonWrongNode)
	}
	if m.Len() != 0 {
		t.Fatalf("a refused ticket spent its jti (%d held)", m.Len())
	}
	wantB := want()
	wantB.NodeID = nodeB
	onB := tickets.NewMemory(clock.NewFake(t0), 0) // node B's own store
	if got, r := v.Redeem(ctx, f.raw(t, forB), t0, wantB, onB); r != "" || got.GetJti() != forB.Jti {
		t.Fatalf("node B redeeming its own ticket: %v %q, want accepted", got, r)
	}
	if got, r := v.Redeem(ctx, f.raw(t, body()), t0, want(), m); r != "" || !proto.Equal(got, body()) {
		t.Fatalf("first use: %v %q, want accepted", got, r)
	}
	if got, r := v.Redeem(ctx, f.raw(t, body()), t0, want(), m); r != tickets.ReasonSpent || got != nil {
		t.Fatalf("second use: %v %q, want %q", got, r, tickets.ReasonSpent)
	}
	if _, r := v.RedeemSigned(ctx, f.sign(t, body()), t0.Add(time.Second), want(), m); r != tickets.ReasonSpent {
		t.Fatalf("second use, parsed: %q, want %q", r, tickets.ReasonSpent)
	}
}

// failingSpent is a spent store that cannot record anything.
type failingSpent struct{ err error }

func (s failingSpent) Spend(context.Context, string, time.Time) error { return s.err }

// TestRedeemFailsClosed checks that a ticket is refused when its jti
// cannot be recorded: a store error, a full store, or no store at all.
func TestRedeemFailsClosed(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for _, c := range []struct {
		name  string
		spent tickets.Spent
		r     tickets.Reason
	}{
		{"store error", failingSpent{errors.New("database down")}, tickets.ReasonSpendFailed},
		{"store full", failingSpent{tickets.ErrFull}, tickets.ReasonSpentStoreFull},
		{"no store", nil, tickets.ReasonSpendFailed},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got, r := f.verifier().Redeem(ctx, f.raw(t, body()), t0, want(), c.spent); r != c.r || got != nil {
				t.Fatalf("%v %q, want %q", got, r, c.r)
			}
		})
	}
}

// TestReasonErr checks the coded errors a caller gets: a safe message
// naming the reason, with the code matching the refusal's kind.
func TestReasonErr(t *testing.T) {
	if tickets.Reason("").Err() != nil {
		t.Fatal("an accepted ticket has an error")
	}
	for r, code := range map[tickets.Reason]errs.Code{
		tickets.ReasonOversized: errs.PayloadTooLarge, tickets.ReasonMalformed: errs.InvalidInput,
		tickets.ReasonSpent: errs.AccessDenied, tickets.ReasonWrongNode: errs.AccessDenied,
		tickets.ReasonSpentStoreFull: errs.ResourceExhausted, tickets.ReasonSpendFailed: errs.Unavailable,
	} {
		err := r.Err()
		if errs.CodeOf(err) != code || !strings.Contains(errs.SafeMessage(err), string(r)) {
			t.Fatalf("%q: %v, want %s naming the reason", r, err, code)
		}
	}
}

// TestSigContextIsDistinct checks that the ticket context differs from
// every other signing context, byte for byte, so no signature crosses
// between them.
func TestSigContextIsDistinct(t *testing.T) {
	for _, c := range []string{wire.CommandSigContext, wire.TimeSigContext, wire.UpdateSigContext, wire.SecretRequestSigContext,
		wire.SandboxReportSigContext, wire.RenewSigContext} {
		if strings.HasPrefix(c, tickets.SigContext) || strings.HasPrefix(tickets.SigContext, c) {
			t.Fatalf("ticket context %q overlaps %q", tickets.SigContext, c)
		}
	}
	f := newFixture(t)
	st := f.sign(t, body())
	pub := f.workerKey.Public().(ed25519.PublicKey)
	if ed25519.Verify(pub, append([]byte(wire.TimeSigContext), st.Body...), st.Signature) ||
		ed25519.Verify(pub, append([]byte(wire.CommandSigContext), st.Body...), st.Signature) {
		t.Fatal("a ticket signature verifies under another context")
	}
}
