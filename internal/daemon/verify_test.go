package daemon

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

type fixture struct {
	v    *Verifier
	now  time.Time
	sign func(body []byte) *nodev1.SignedCommand
	// bundle and kek are the PKI the verifier pins (for tests that make a
	// whole node on it).
	bundle *pki.Bundle
	kek    pki.KEK
}

func newFixture(t testing.TB) fixture {
	t.Helper()
	now := time.Now()
	kek, err := pki.CreateKEK(filepath.Join(t.TempDir(), "kek"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := pki.Init(filepath.Join(t.TempDir(), "pki"), "unit.bc.local", kek, clock.NewFake(now.Add(-48*time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	rk, err := b.CommandRootKey(kek)
	if err != nil {
		t.Fatal(err)
	}
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	cert, err := pki.IssueWorkerCert(b.CommandRoot, rk, b.TrustDomain, "w1", pub, 24*time.Hour, now.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return fixture{
		v:      &Verifier{NodeID: "n1", Role: pki.RoleNode, TrustDomain: b.TrustDomain, CommandRoots: []*x509.Certificate{b.CommandRoot}},
		now:    now,
		bundle: b,
		kek:    kek,
		sign: func(body []byte) *nodev1.SignedCommand {
			var cb nodev1.CommandBody
			_ = proto.Unmarshal(body, &cb)
			return &nodev1.SignedCommand{Id: cb.CommandId, Body: body, Signature: ed25519.Sign(priv, append([]byte(wire.CommandSigContext), body...)), SignerCertDer: cert}
		},
	}
}

func (f fixture) body(mut func(*nodev1.CommandBody)) []byte {
	b := &nodev1.CommandBody{CommandId: "c1", NodeId: "n1", Kind: "diag.run", Payload: []byte("{}"),
		IssuedAtMs: f.now.UnixMilli(), ExpiresAtMs: f.now.Add(10 * time.Minute).UnixMilli(), Nonce: "x"}
	if mut != nil {
		mut(b)
	}
	raw, _ := proto.MarshalOptions{Deterministic: true}.Marshal(b)
	return raw
}

func never(string) bool { return false }

func TestVerifierRefusals(t *testing.T) {
	f := newFixture(t)
	if _, reason := f.v.Check(f.sign(f.body(nil)), f.now, nil, never); reason != "" {
		t.Fatalf("good command refused: %s", reason)
	}
	cases := []struct {
		name   string
		cmd    func() *nodev1.SignedCommand
		allow  []string
		seen   func(string) bool
		reason string
	}{
		{"no signature", func() *nodev1.SignedCommand { c := f.sign(f.body(nil)); c.Signature = nil; return c }, nil, never, ReasonSignatureMissing},
		{"no signer", func() *nodev1.SignedCommand { c := f.sign(f.body(nil)); c.SignerCertDer = nil; return c }, nil, never, ReasonSignatureMissing},
		{"garbage body", func() *nodev1.SignedCommand { c := f.sign(f.body(nil)); c.Body = []byte{0xff, 0xff}; return c }, nil, never, ReasonBodyMalformed},
		{"bad signature", func() *nodev1.SignedCommand { c := f.sign(f.body(nil)); c.Signature[3] ^= 1; return c }, nil, never, ReasonSignatureInvalid},
		{"garbage signer", func() *nodev1.SignedCommand { c := f.sign(f.body(nil)); c.SignerCertDer = []byte{1, 2}; return c }, nil, never, ReasonSignerUntrusted},
		{"envelope id differs", func() *nodev1.SignedCommand { c := f.sign(f.body(nil)); c.Id = "c2"; return c }, nil, never, ReasonIDMismatch},
		{"other node", func() *nodev1.SignedCommand {
			return f.sign(f.body(func(b *nodev1.CommandBody) { b.NodeId = "n2" }))
		}, nil, never, ReasonWrongNode},
		{"expired", func() *nodev1.SignedCommand {
			return f.sign(f.body(func(b *nodev1.CommandBody) { b.ExpiresAtMs = f.now.Add(-time.Second).UnixMilli() }))
		}, nil, never, ReasonExpired},
		{"lifetime too long", func() *nodev1.SignedCommand {
			return f.sign(f.body(func(b *nodev1.CommandBody) { b.ExpiresAtMs = f.now.Add(25 * time.Hour).UnixMilli() }))
		}, nil, never, ReasonExpired},
		{"future", func() *nodev1.SignedCommand {
			return f.sign(f.body(func(b *nodev1.CommandBody) {
				b.IssuedAtMs = f.now.Add(10 * time.Minute).UnixMilli()
				b.ExpiresAtMs = f.now.Add(20 * time.Minute).UnixMilli()
			}))
		}, nil, never, ReasonNotYetValid},
		{"replayed", func() *nodev1.SignedCommand { return f.sign(f.body(nil)) }, nil, func(id string) bool { return id == "c1" }, ReasonReplayed},
		{"kind outside role", func() *nodev1.SignedCommand {
			return f.sign(f.body(func(b *nodev1.CommandBody) { b.Kind = "bmc.powerOff" }))
		}, nil, never, ReasonKindNotAllowed},
		{"kind outside allowed list", func() *nodev1.SignedCommand { return f.sign(f.body(nil)) }, []string{"node.ping"}, never, ReasonKindNotAllowed},
		// The worker certificate is valid from now-1h-1m to now+23h; the
		// chain is checked at the body's issue time.
		{"signer expired at issue", func() *nodev1.SignedCommand {
			return f.sign(f.body(func(b *nodev1.CommandBody) {
				b.IssuedAtMs = f.now.Add(23*time.Hour + time.Millisecond).UnixMilli()
				b.ExpiresAtMs = f.now.Add(24 * time.Hour).UnixMilli()
			}))
		}, nil, never, ReasonSignerUntrusted},
		{"signer not yet valid at issue", func() *nodev1.SignedCommand {
			return f.sign(f.body(func(b *nodev1.CommandBody) { b.IssuedAtMs = f.now.Add(-2 * time.Hour).UnixMilli() }))
		}, nil, never, ReasonSignerUntrusted},
	}
	// Every refusal is the same with the worker-chain memo, whose entry
	// for this signer a good command stored first.
	memo := *f.v
	memo.WorkerChains = pki.NewWorkerChainCache(0)
	if _, reason := memo.Check(f.sign(f.body(nil)), f.now, nil, never); reason != "" || memo.WorkerChains.Len() != 1 {
		t.Fatalf("good command through the memo: %q, %d entries", reason, memo.WorkerChains.Len())
	}
	for _, v := range []struct {
		name string
		v    *Verifier
	}{{"full", f.v}, {"memo", &memo}} {
		for _, c := range cases {
			t.Run(v.name+"/"+c.name, func(t *testing.T) {
				if _, reason := v.v.Check(c.cmd(), f.now, c.allow, c.seen); reason != c.reason {
					t.Fatalf("reason %q, want %q", reason, c.reason)
				}
			})
		}
	}
	other := *f.v
	other.Role = pki.RoleSite
	if _, reason := other.Check(f.sign(f.body(nil)), f.now, nil, never); reason != ReasonKindNotAllowed {
		t.Fatalf("site role ran diag.run: %q", reason)
	}
	// A verifier of another trust domain sharing the memo finds no entry
	// for its own inputs and refuses the signer.
	otherTD := memo
	otherTD.TrustDomain = "other.bc.local"
	if _, reason := otherTD.Check(f.sign(f.body(nil)), f.now, nil, never); reason != ReasonSignerUntrusted {
		t.Fatalf("other trust domain through a shared memo: %q, want %q", reason, ReasonSignerUntrusted)
	}
}

// FuzzVerifierCheck feeds arbitrary envelopes to the verifier: it must
// never panic and never accept anything not signed by the worker key.
func FuzzVerifierCheck(f *testing.F) {
	fx := newFixture(f)
	good := fx.sign(fx.body(nil))
	f.Add(good.Id, good.Body, good.Signature, good.SignerCertDer)
	f.Add("c1", []byte{}, []byte{1}, []byte{2})
	f.Add("c1", good.Body[:len(good.Body)/2], good.Signature, good.SignerCertDer)
	flipped := append([]byte(nil), good.Signature...)
	flipped[0] ^= 1
	f.Add(good.Id, good.Body, flipped, good.SignerCertDer) // a signature that does not verify, all else genuine
	f.Fuzz(func(t *testing.T, id string, body, sig, cert []byte) {
		c := &nodev1.SignedCommand{Id: id, Body: body, Signature: sig, SignerCertDer: cert}
		_, reason := fx.v.Check(c, fx.now, nil, never)
		if reason == "" && !(string(sig) == string(good.Signature) && string(body) == string(good.Body)) {
			t.Fatalf("accepted an envelope the worker did not sign: id=%q", id)
		}
	})
}

// TestCheckKeptVerifiesAgain: a kept signed command verifies again long
// after it expired (it is read, not run) and gives its payload; a
// changed byte of its body or signature, a signer outside the pinned
// roots, another node's command, another kind and bytes that are no
// signed command are each refused by reason.
func TestCheckKeptVerifiesAgain(t *testing.T) {
	f := newFixture(t)
	kept := func(c *nodev1.SignedCommand) []byte {
		b, _ := proto.Marshal(c)
		return b
	}
	good := f.sign(f.body(func(b *nodev1.CommandBody) {
		b.Kind, b.Payload, b.ExpiresAtMs = "sandbox.create", []byte(`{"sandbox_id":"x"}`), f.now.Add(time.Minute).UnixMilli()
	}))
	if p, err := f.v.CheckKept(kept(good), "sandbox.create"); err != nil || string(p) != `{"sandbox_id":"x"}` {
		t.Fatalf("kept command: %q %v", p, err)
	}
	tamperedBody := proto.Clone(good).(*nodev1.SignedCommand)
	tamperedBody.Body[bytes.Index(tamperedBody.Body, []byte(`"x"`))+1] = 'y' // another sandbox
	tamperedSig := proto.Clone(good).(*nodev1.SignedCommand)
	tamperedSig.Signature[5] ^= 1
	unsigned := proto.Clone(good).(*nodev1.SignedCommand)
	unsigned.Signature = nil
	foreign := newFixture(t).sign(f.body(func(b *nodev1.CommandBody) { b.Kind = "sandbox.create" }))
	otherNode := f.sign(f.body(func(b *nodev1.CommandBody) { b.Kind, b.NodeId = "sandbox.create", "n2" }))
	for name, c := range map[string]struct {
		signed []byte
		kind   string
		want   string
	}{
		"body changed":      {kept(tamperedBody), "sandbox.create", ReasonSignatureInvalid},
		"signature changed": {kept(tamperedSig), "sandbox.create", ReasonSignatureInvalid},
		"unsigned":          {kept(unsigned), "sandbox.create", ReasonSignatureMissing},
		"other roots":       {kept(foreign), "sandbox.create", ReasonSignerUntrusted},
		"other node":        {kept(otherNode), "sandbox.create", ReasonWrongNode},
		"other kind":        {kept(good), "sandbox.update", ReasonKindNotAllowed},
		"not a command":     {[]byte{0xff, 0xff}, "sandbox.create", ReasonBodyMalformed},
	} {
		if _, err := f.v.CheckKept(c.signed, c.kind); err == nil || err.Error() != c.want {
			t.Errorf("%s: %v, want %s", name, err, c.want)
		}
	}
}
