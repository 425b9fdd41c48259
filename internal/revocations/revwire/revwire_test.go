package revwire_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/x509"
	"crypto/x509/pkix"
	"flag"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/revocations/revwire"
	"github.com/bettercompute/bettercompute/internal/tickets"
)

// t0 is the fixed time the tests verify at, so the committed fuzz seeds
// stay valid (their signer certificate is valid around it).
var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

const (
	trustDomain = "rev.bc.local"
	deployment  = "rev-deployment"
	nodeA       = "n_nodea"
	nodeB       = "n_nodeb"
)

// seedKey is a deterministic Ed25519 key: the committed fuzz seeds are
// signed by keys these give again on every run.
func seedKey(b byte) ed25519.PrivateKey {
	seed := bytes.Repeat([]byte{b}, ed25519.SeedSize)
	return ed25519.NewKeyFromSeed(seed)
}

// newRoot makes a command-signing root for key, valid 2020 to 2050.
func newRoot(tb testing.TB, key ed25519.PrivateKey, name string) *x509.Certificate {
	tb.Helper()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC), NotAfter: time.Date(2050, 1, 1, 0, 0, 0, 0, time.UTC),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(nil, tmpl, tmpl, key.Public(), key)
	if err != nil {
		tb.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// signer is a worker key (seed) certified under a root (seed).
type signer struct {
	root *x509.Certificate
	key  ed25519.PrivateKey
	cert []byte
}

func newSigner(tb testing.TB, rootSeed, keySeed byte, td string) signer {
	tb.Helper()
	rk := seedKey(rootSeed)
	root := newRoot(tb, rk, fmt.Sprintf("root %d", rootSeed))
	k := seedKey(keySeed)
	der, err := pki.IssueWorkerCert(root, rk, td, "wkrev", k.Public().(ed25519.PublicKey), 24*time.Hour, t0.Add(-time.Hour))
	if err != nil {
		tb.Fatal(err)
	}
	return signer{root: root, key: k, cert: der}
}

func (s signer) signRaw(raw []byte, ctx string) *nodev1.SignedRevocation {
	return &nodev1.SignedRevocation{Body: raw, Signature: ed25519.Sign(s.key, append([]byte(ctx), raw...)), SignerCertDer: s.cert}
}

func (s signer) sign(tb testing.TB, b *nodev1.RevocationBody) *nodev1.SignedRevocation {
	tb.Helper()
	raw, err := revwire.Marshal(b)
	if err != nil {
		tb.Fatal(err)
	}
	return s.signRaw(raw, revwire.SigContext)
}

func marshal(tb testing.TB, m proto.Message) []byte {
	tb.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// genuine is the genuine entry's body: an SSH serial of nodeA.
func genuine() *nodev1.RevocationBody {
	return revwire.Body(revwire.Entry{Seq: 7, Kind: revwire.KindSSHCert, Subject: "12345", TenantID: "t_tenant", NodeID: nodeA,
		At: t0.Add(-time.Second), Reason: "operator", Generation: 3}, deployment, trustDomain)
}

// verifier is nodeA's, pinning only the genuine root.
func verifier(root *x509.Certificate) *revwire.Verifier {
	return &revwire.Verifier{Roots: func() []*x509.Certificate { return []*x509.Certificate{root} }, TrustDomain: trustDomain,
		Deployment: deployment, NodeID: nodeA}
}

// TestVerifyRefusals: a node takes only an entry a worker of its own
// deployment signed, under its context, for itself, of a kind for nodes;
// each forgery is refused by its own reason.
func TestVerifyRefusals(t *testing.T) {
	w := newSigner(t, 1, 2, trustDomain)
	foreign := newSigner(t, 3, 4, trustDomain)   // another deployment's root
	otherTD := newSigner(t, 1, 5, "other.local") // the right root, another trust domain
	mod := func(f func(b *nodev1.RevocationBody)) *nodev1.RevocationBody { b := genuine(); f(b); return b }
	tampered := w.sign(t, genuine())
	tampered.Body = marshal(t, mod(func(b *nodev1.RevocationBody) { b.Subject = "54321" }))
	for name, c := range map[string]struct {
		s    *nodev1.SignedRevocation
		want revwire.Reason
	}{
		"genuine":          {w.sign(t, genuine()), ""},
		"ticket":           {w.sign(t, mod(func(b *nodev1.RevocationBody) { b.Kind, b.Subject = revwire.KindTicket, "tk_1" })), ""},
		"foreign signer":   {foreign.sign(t, genuine()), revwire.ReasonSignerUntrusted},
		"other trust dom":  {otherTD.sign(t, genuine()), revwire.ReasonSignerUntrusted},
		"tampered body":    {tampered, revwire.ReasonSignatureInvalid},
		"command context":  {w.signRaw(marshal(t, genuine()), wire.CommandSigContext), revwire.ReasonSignatureInvalid},
		"ticket context":   {w.signRaw(marshal(t, genuine()), tickets.SigContext), revwire.ReasonSignatureInvalid},
		"other deployment": {w.sign(t, mod(func(b *nodev1.RevocationBody) { b.Deployment = "other" })), revwire.ReasonOtherDeployment},
		"other node":       {w.sign(t, mod(func(b *nodev1.RevocationBody) { b.NodeId = nodeB })), revwire.ReasonOtherNode},
		"credential kind":  {w.sign(t, mod(func(b *nodev1.RevocationBody) { b.Kind, b.Subject = revwire.KindAPIKey, "k_1" })), revwire.ReasonUnexpectedKind},
		"node-cert kind":   {w.sign(t, mod(func(b *nodev1.RevocationBody) { b.Kind = revwire.KindNodeCert })), revwire.ReasonUnexpectedKind},
		"bad ssh serial":   {w.sign(t, mod(func(b *nodev1.RevocationBody) { b.Subject = "0012" })), revwire.ReasonMalformed},
		"no seq":           {w.sign(t, mod(func(b *nodev1.RevocationBody) { b.Seq = 0 })), revwire.ReasonMalformed},
		"no signature":     {&nodev1.SignedRevocation{Body: marshal(t, genuine()), SignerCertDer: w.cert}, revwire.ReasonMalformed},
		"oversized":        {w.signRaw(bytes.Repeat([]byte{0}, revwire.MaxSize), revwire.SigContext), revwire.ReasonOversized},
	} {
		got, r := verifier(w.root).VerifySigned(c.s, t0)
		if r != c.want || (r == "") != (got != nil) {
			t.Errorf("%s: reason %q (body %v), want %q", name, r, got != nil, c.want)
		}
	}
}

// updateSeeds rewrites the committed fuzz corpus:
// go test ./internal/revocations/revwire -run TestFuzzSeeds -update-seeds
var updateSeeds = flag.Bool("update-seeds", false, "rewrite testdata/fuzz/FuzzVerify")

var seedDir = filepath.Join("testdata", "fuzz", "FuzzVerify")

// seeds: the genuine entry, genuinely signed entries that must be
// refused, and garbage; every signature by deterministic keys.
func seeds(tb testing.TB) (map[string][]byte, map[string]revwire.Reason) {
	w := newSigner(tb, 1, 2, trustDomain)
	other := genuine()
	other.NodeId = nodeB
	return map[string][]byte{
			"genuine":     marshal(tb, w.sign(tb, genuine())),
			"other-node":  marshal(tb, w.sign(tb, other)),
			"command-sig": marshal(tb, w.signRaw(marshal(tb, genuine()), wire.CommandSigContext)),
			"garbage":     []byte("\x0a\x05hello\x12\xff\x01garbage"),
		}, map[string]revwire.Reason{"genuine": "", "other-node": revwire.ReasonOtherNode, "command-sig": revwire.ReasonSignatureInvalid,
			"garbage": revwire.ReasonMalformed}
}

// TestFuzzSeeds checks the committed corpus means what its names say.
func TestFuzzSeeds(t *testing.T) {
	raws, want := seeds(t)
	if *updateSeeds {
		if err := os.MkdirAll(seedDir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, raw := range raws {
			if err := os.WriteFile(filepath.Join(seedDir, name), fmt.Appendf(nil, "go test fuzz v1\n[]byte(%q)\n", raw), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	root := newSigner(t, 1, 2, trustDomain).root
	for name, r := range want {
		file, err := os.ReadFile(filepath.Join(seedDir, name))
		if err != nil {
			t.Fatal(err)
		}
		var raw []byte
		if _, err := fmt.Sscanf(string(bytes.TrimPrefix(file, []byte("go test fuzz v1\n"))), "[]byte(%q)", &raw); err != nil {
			t.Fatalf("seed %s: %v", name, err)
		}
		if _, got := verifier(root).Verify(raw, t0); got != r {
			t.Fatalf("seed %s: %q, want %q", name, got, r)
		}
	}
}

var reasons = map[revwire.Reason]bool{"": true, revwire.ReasonOversized: true, revwire.ReasonMalformed: true, revwire.ReasonSignerUntrusted: true,
	revwire.ReasonSignatureInvalid: true, revwire.ReasonOtherDeployment: true, revwire.ReasonOtherNode: true, revwire.ReasonUnexpectedKind: true}

// FuzzVerify feeds arbitrary bytes to the node's entry decoding. Property:
// nothing panics; every answer is a known reason; a refusal returns no
// body; the only entry ever accepted is the genuine body the fixture
// signed (the fuzzer holds no key); Verify and VerifySigned agree.
func FuzzVerify(f *testing.F) {
	raws, _ := seeds(f)
	for _, raw := range raws {
		f.Add(raw)
	}
	root := newSigner(f, 1, 2, trustDomain).root
	v := verifier(root)
	want := marshal(f, genuine())
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, r := v.Verify(raw, t0)
		if !reasons[r] {
			t.Fatalf("unknown reason %q", r)
		}
		if r != "" {
			if got != nil {
				t.Fatalf("refused (%q) with a body", r)
			}
			return
		}
		var s nodev1.SignedRevocation
		if err := proto.Unmarshal(raw, &s); err != nil {
			t.Fatalf("accepted bytes that do not parse: %v", err)
		}
		if !bytes.Equal(s.Body, want) || !proto.Equal(got, genuine()) {
			t.Fatalf("accepted a body that is not the genuine one: %v", got)
		}
		if _, r2 := v.VerifySigned(&s, t0); r2 != "" {
			t.Fatalf("Verify accepted what VerifySigned refuses (%q)", r2)
		}
	})
}
