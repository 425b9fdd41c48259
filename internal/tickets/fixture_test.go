package tickets_test

import (
	"crypto/ed25519"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/tickets"
)

// t0 is the fixed time the tests verify at, so the committed fuzz seeds
// stay valid (their signer certificate is valid around it).
var t0 = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

const (
	trustDomain = "tickets.bc.local"
	nodeA       = "n_nodea"
	nodeB       = "n_nodeb"
)

// want is what the fixture's genuine ticket is for.
func want() tickets.Want {
	return tickets.Want{NodeID: nodeA, Port: 22, Actions: []string{tickets.ActionNodeTunnel}}
}

// fixture is a command-signing root and a worker key it certified.
type fixture struct {
	root      *x509.Certificate
	rootKey   ed25519.PrivateKey
	workerKey ed25519.PrivateKey
	workerDER []byte
}

// seedKey is a deterministic Ed25519 key: the fuzz seeds committed under
// testdata are signed by keys these give again on every run.
func seedKey(b byte) ed25519.PrivateKey {
	seed := make([]byte, ed25519.SeedSize)
	for i := range seed {
		seed[i] = b
	}
	return ed25519.NewKeyFromSeed(seed)
}

// newRoot makes a command-signing root for key, valid 2020 to 2050; with
// a fixed key it is the same root on every run (Ed25519 signs
// deterministically).
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
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	return cert
}

// newFixture returns the deterministic root (seed 1) and worker key
// (seed 2), the worker certified from t0-1h for 24 h in trustDomain.
func newFixture(tb testing.TB) *fixture {
	tb.Helper()
	f := &fixture{rootKey: seedKey(1), workerKey: seedKey(2)}
	f.root = newRoot(tb, f.rootKey, "test command root")
	f.workerDER = f.certify(tb, f.root, f.rootKey, trustDomain, t0.Add(-time.Hour), 24*time.Hour)
	return f
}

// certify issues a worker certificate for the fixture's worker key.
func (f *fixture) certify(tb testing.TB, root *x509.Certificate, rootKey ed25519.PrivateKey, td string, at time.Time, life time.Duration) []byte {
	tb.Helper()
	der, err := pki.IssueWorkerCert(root, rootKey, td, "wktest", f.workerKey.Public().(ed25519.PublicKey), life, at)
	if err != nil {
		tb.Fatal(err)
	}
	return der
}

// verifier verifies against the fixture's root only.
func (f *fixture) verifier() *tickets.Verifier {
	return &tickets.Verifier{Roots: func() []*x509.Certificate { return []*x509.Certificate{f.root} }, TrustDomain: trustDomain}
}

// body is the genuine ticket's body: for want(), issued 1 s before t0.
func body() *nodev1.TicketBody {
	return &nodev1.TicketBody{Jti: "tk_genuine", NodeId: nodeA, Port: 22, Action: tickets.ActionNodeTunnel,
		TenantId: "t_tenant", Caller: "identity/alice", IssuedAtMs: t0.Add(-time.Second).UnixMilli(),
		ExpiresAtMs: t0.Add(-time.Second).Add(tickets.Lifetime).UnixMilli()}
}

// marshal is the deterministic encoding the workers sign.
func marshal(tb testing.TB, m proto.Message) []byte {
	tb.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// signRaw signs the exact bytes raw under sigContext with the worker key.
func (f *fixture) signRaw(raw []byte, sigContext string) *nodev1.SignedTicket {
	return &nodev1.SignedTicket{Body: raw, Signature: ed25519.Sign(f.workerKey, append([]byte(sigContext), raw...)), SignerCertDer: f.workerDER}
}

// sign signs b as the workers do (SigContext, deterministic marshal).
func (f *fixture) sign(tb testing.TB, b *nodev1.TicketBody) *nodev1.SignedTicket {
	tb.Helper()
	return f.signRaw(marshal(tb, b), tickets.SigContext)
}

// raw is sign, marshalled.
func (f *fixture) raw(tb testing.TB, b *nodev1.TicketBody) []byte {
	tb.Helper()
	return marshal(tb, f.sign(tb, b))
}
