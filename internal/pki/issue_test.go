package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"math/big"
	"net"
	"net/url"
	"testing"
	"time"
)

type caPair struct {
	cert *x509.Certificate
	key  crypto.Signer
}

func nodeCA(t *testing.T) (caPair, *Bundle) {
	t.Helper()
	b, kek, _ := newBundle(t)
	k, err := b.NodeCAKey(kek)
	if err != nil {
		t.Fatal(err)
	}
	return caPair{b.NodeCA, k}, b
}

func mustCSR(t *testing.T, key crypto.Signer) []byte {
	t.Helper()
	der, err := CSR(key, "informational")
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func pool(certs ...*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}

func parse(t *testing.T, der []byte) *x509.Certificate {
	t.Helper()
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// craft signs an arbitrary leaf template with ca, for certificates the
// issuing functions refuse to make.
func craft(t *testing.T, ca caPair, tmpl *x509.Certificate) *x509.Certificate {
	t.Helper()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl.SerialNumber = big.NewInt(42)
	if tmpl.NotBefore.IsZero() {
		tmpl.NotBefore, tmpl.NotAfter = t0.Add(-time.Minute), t0.Add(time.Hour)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, k.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return parse(t, der)
}

func roleExt(t *testing.T, role string) pkix.Extension {
	v, err := asn1.MarshalWithParams(role, "utf8")
	if err != nil {
		t.Fatal(err)
	}
	return pkix.Extension{Id: RoleExtensionOID, Value: v}
}

func TestIssueNodeCertAndVerify(t *testing.T) {
	ca, _ := nodeCA(t)
	ecKey, _ := NewNodeKey()
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	for _, tt := range []struct {
		name string
		key  crypto.Signer
		role string
	}{{"p256 node", ecKey, RoleNode}, {"ed25519 ramdisk", edKey, RoleRamdisk}, {"site", ecKey, RoleSite}, {"tenant", ecKey, RoleNodeTenant}} {
		t.Run(tt.name, func(t *testing.T) {
			der, err := IssueNodeCert(ca.cert, ca.key, mustCSR(t, tt.key), td, "node-1", tt.role, 24*time.Hour, t0)
			if err != nil {
				t.Fatal(err)
			}
			c := parse(t, der)
			if c.Subject.CommonName != "node-1" || len(c.URIs) != 1 || c.URIs[0].String() != "spiffe://dev.bc.local/node/node-1" ||
				c.KeyUsage != x509.KeyUsageDigitalSignature || len(c.ExtKeyUsage) != 1 || c.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth ||
				c.IsCA || !c.NotBefore.Equal(t0.Add(-time.Minute)) || !c.NotAfter.Equal(t0.Add(24*time.Hour)) ||
				c.SerialNumber.BitLen() > 128 || c.SerialNumber.Sign() <= 0 {
				t.Fatalf("unexpected certificate %+v", c)
			}
			if pub, ok := c.PublicKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(tt.key.Public()) {
				t.Fatal("certificate key is not the CSR key")
			}
			id, err := VerifyNodeChain([]*x509.Certificate{c}, pool(ca.cert), td, t0.Add(time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			want := NodeIdentity{TrustDomain: td, NodeID: "node-1", Role: tt.role, Serial: SerialHex(c), NotBefore: c.NotBefore, NotAfter: c.NotAfter}
			if id != want {
				t.Fatalf("identity = %+v, want %+v", id, want)
			}
		})
	}
}

func TestVerifyNodeChainRefusals(t *testing.T) {
	ca, _ := nodeCA(t)
	other, _ := nodeCA(t)
	key, _ := NewNodeKey()
	issue := func(c caPair, tdom string) *x509.Certificate {
		der, err := IssueNodeCert(c.cert, c.key, mustCSR(t, key), tdom, "node-1", RoleNode, time.Hour, t0)
		if err != nil {
			t.Fatal(err)
		}
		return parse(t, der)
	}
	good := issue(ca, td)
	nodeURI := NodeSPIFFEID(td, "node-1")
	clientEKU := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	var invalidCert x509.CertificateInvalidError
	var unknownAuth x509.UnknownAuthorityError
	tests := []struct {
		name    string
		chain   []*x509.Certificate
		roots   *x509.CertPool
		now     time.Time
		wantAs  any
		wantErr string
	}{
		{name: "wrong trust domain", chain: []*x509.Certificate{issue(ca, "prod.bc.local")}, roots: pool(ca.cert), now: t0,
			wantErr: `pki: node certificate is for trust domain "prod.bc.local", want "dev.bc.local"`},
		{name: "expired", chain: []*x509.Certificate{good}, roots: pool(ca.cert), now: t0.Add(time.Hour + time.Second), wantAs: &invalidCert},
		{name: "not yet valid", chain: []*x509.Certificate{good}, roots: pool(ca.cert), now: t0.Add(-2 * time.Minute), wantAs: &invalidCert},
		{name: "other CA", chain: []*x509.Certificate{issue(other, td)}, roots: pool(ca.cert), now: t0, wantAs: &unknownAuth},
		{name: "invalid role", roots: pool(ca.cert), now: t0, wantErr: `pki: invalid role "admin"`, chain: []*x509.Certificate{craft(t, ca, &x509.Certificate{
			URIs: []*url.URL{nodeURI}, ExtKeyUsage: clientEKU, ExtraExtensions: []pkix.Extension{roleExt(t, "admin")}})}},
		{name: "no role", roots: pool(ca.cert), now: t0, wantErr: "pki: certificate must carry exactly one role extension, has 0", chain: []*x509.Certificate{craft(t, ca, &x509.Certificate{
			URIs: []*url.URL{nodeURI}, ExtKeyUsage: clientEKU})}},
		{name: "server EKU", roots: pool(ca.cert), now: t0, wantAs: &invalidCert, chain: []*x509.Certificate{craft(t, ca, &x509.Certificate{
			URIs: []*url.URL{nodeURI}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, ExtraExtensions: []pkix.Extension{roleExt(t, RoleNode)}})}},
		{name: "nil roots", chain: []*x509.Certificate{good}, now: t0, wantErr: "pki: no node roots given"},
		{name: "empty chain", roots: pool(ca.cert), now: t0, wantErr: "pki: empty certificate chain"},
		{name: "zero time", chain: []*x509.Certificate{good}, roots: pool(ca.cert), wantErr: "pki: verification time not set"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := VerifyNodeChain(tt.chain, tt.roots, td, tt.now)
			if tt.wantAs != nil {
				if !errors.As(err, tt.wantAs) {
					t.Fatalf("err = %v, want %T", err, tt.wantAs)
				}
				return
			}
			if err == nil || err.Error() != tt.wantErr {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
		})
	}
	if !errors.As(mustErr(VerifyNodeChain([]*x509.Certificate{good}, pool(ca.cert), td, t0.Add(2*time.Hour))), &invalidCert) || invalidCert.Reason != x509.Expired {
		t.Fatalf("expired reason = %v", invalidCert.Reason)
	}
}

func mustErr(_ any, err error) error { return err }

func TestParseNodeCertRefusals(t *testing.T) {
	ca, _ := nodeCA(t)
	badUTF8Type, _ := asn1.Marshal(asn1.RawValue{Class: asn1.ClassUniversal, Tag: asn1.TagPrintableString, Bytes: []byte("node")})
	mk := func(uris []string, exts ...pkix.Extension) *x509.Certificate {
		var us []*url.URL
		for _, s := range uris {
			u, err := url.Parse(s)
			if err != nil {
				t.Fatal(err)
			}
			us = append(us, u)
		}
		return craft(t, ca, &x509.Certificate{URIs: us, ExtraExtensions: exts})
	}
	role := roleExt(t, RoleNode)
	tests := []struct {
		name string
		cert *x509.Certificate
		want string
	}{
		{"no URI", mk(nil, role), "pki: node certificate must have exactly one URI SAN, has 0"},
		{"two URIs", mk([]string{"spiffe://dev.bc.local/node/a", "spiffe://dev.bc.local/node/b"}, role), "pki: node certificate must have exactly one URI SAN, has 2"},
		{"https scheme", mk([]string{"https://dev.bc.local/node/a"}, role), "pki: URI SAN is not a spiffe ID"},
		{"gateway ID", mk([]string{"spiffe://dev.bc.local/gateway"}, role), `pki: spiffe ID "spiffe://dev.bc.local/gateway" is not a node ID`},
		{"uppercase id", mk([]string{"spiffe://dev.bc.local/node/A"}, role), `pki: spiffe ID "spiffe://dev.bc.local/node/A" has an invalid node id`},
		{"nested path", mk([]string{"spiffe://dev.bc.local/node/a/b"}, role), `pki: spiffe ID "spiffe://dev.bc.local/node/a/b" has an invalid node id`},
		{"escaped slash", mk([]string{"spiffe://dev.bc.local/node/a%2Fb"}, role), `pki: spiffe ID "spiffe://dev.bc.local/node/a%2Fb" has an invalid node id`},
		{"query", mk([]string{"spiffe://dev.bc.local/node/a?x=1"}, role), `pki: spiffe ID "spiffe://dev.bc.local/node/a?x=1" is not canonical`},
		{"port", mk([]string{"spiffe://dev.bc.local:1/node/a"}, role), `pki: trust domain "dev.bc.local:1": only [a-z0-9.-] allowed`},
		{"userinfo", mk([]string{"spiffe://u@dev.bc.local/node/a"}, role), `pki: spiffe ID "spiffe://u@dev.bc.local/node/a" is not canonical`},
		{"role not UTF8String", mk([]string{"spiffe://dev.bc.local/node/a"}, pkix.Extension{Id: RoleExtensionOID, Value: badUTF8Type}), "pki: malformed role extension"},
		{"role trailing bytes", mk([]string{"spiffe://dev.bc.local/node/a"}, pkix.Extension{Id: RoleExtensionOID, Value: append(role.Value, 0)}), "pki: malformed role extension"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseNodeCert(tt.cert)
			if err == nil || err.Error() != tt.want {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestIssueNodeCertRefusals(t *testing.T) {
	ca, b := nodeCA(t)
	key, _ := NewNodeKey()
	csr := mustCSR(t, key)
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	badSig := mustCSR(t, edKey)
	badSig[len(badSig)-1] ^= 1 // last byte of the Ed25519 signature
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	tests := []struct {
		name     string
		ca       caPair
		csr      []byte
		tdom, id string
		role     string
		lifetime time.Duration
		now      time.Time
		want     string
	}{
		{"invalid role", ca, csr, td, "n1", "admin", time.Hour, t0, `pki: invalid role "admin"`},
		{"bad CSR signature", ca, badSig, td, "n1", RoleNode, time.Hour, t0, "pki: CSR signature: x509: Ed25519 verification failure"},
		{"lifetime too long", ca, csr, td, "n1", RoleNode, 30*24*time.Hour + time.Second, t0, "pki: node certificate lifetime 720h0m1s must be > 0 and <= 720h0m0s"},
		{"zero lifetime", ca, csr, td, "n1", RoleNode, 0, t0, "pki: node certificate lifetime 0s must be > 0 and <= 720h0m0s"},
		{"outlives CA", ca, csr, td, "n1", RoleNode, time.Hour, b.NodeCA.NotAfter, "pki: node certificate would outlive its CA (CA expires 2036-03-01T12:00:00Z)"},
		{"bad node id", ca, csr, td, "Node_1", RoleNode, time.Hour, t0, `pki: invalid node id "Node_1"`},
		{"bad trust domain", ca, csr, "BAD", "n1", RoleNode, time.Hour, t0, `pki: trust domain "BAD": only [a-z0-9.-] allowed`},
		{"P-384 key", ca, mustCSR(t, p384), td, "n1", RoleNode, time.Hour, t0, "pki: CSR key must be ECDSA P-256 or Ed25519"},
		{"garbage CSR", ca, []byte{0x30, 0}, td, "n1", RoleNode, time.Hour, t0, "pki: parse CSR: asn1: syntax error: sequence truncated"},
		{"leaf as CA", caPair{craft(t, ca, &x509.Certificate{}), key}, csr, td, "n1", RoleNode, time.Hour, t0, "pki: issuer certificate is not a CA"},
		{"key not the CA's", caPair{ca.cert, key}, csr, td, "n1", RoleNode, time.Hour, t0, "pki: sign certificate: x509: provided PrivateKey doesn't match parent's PublicKey"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := IssueNodeCert(tt.ca.cert, tt.ca.key, tt.csr, tt.tdom, tt.id, tt.role, tt.lifetime, tt.now)
			if err == nil || err.Error() != tt.want {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestIssueServerCert(t *testing.T) {
	b, kek, _ := newBundle(t)
	k, err := b.InternalCAKey(kek)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := IssueServerCert(b.InternalCA, k, td, []string{"localhost"}, []net.IP{net.ParseIP("127.0.0.1")}, 90*24*time.Hour, t0)
	if err != nil {
		t.Fatal(err)
	}
	leaf := tc.Leaf
	for _, name := range []string{"localhost", "127.0.0.1"} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool(b.InternalCA), DNSName: name, CurrentTime: t0}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != "spiffe://dev.bc.local/gateway" || leaf.ExtKeyUsage[0] != x509.ExtKeyUsageServerAuth {
		t.Fatalf("leaf = %+v", leaf)
	}
	if !tc.PrivateKey.(*ecdsa.PrivateKey).PublicKey.Equal(leaf.PublicKey) {
		t.Fatal("key mismatch")
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool(b.NodeCA), DNSName: "localhost", CurrentTime: t0}); err == nil {
		t.Fatal("server cert verifies against node CA")
	}
	if _, err := IssueServerCert(b.InternalCA, k, td, nil, nil, 399*24*time.Hour, t0); err == nil || err.Error() != "pki: server certificate lifetime 9576h0m0s must be > 0 and <= 9552h0m0s" {
		t.Fatalf("long lifetime: %v", err)
	}
}

func TestWorkerChain(t *testing.T) {
	f := newWorkerChainFixture(t)
	b, other, rootKey, wpub, der, otherDER := f.b, f.other, f.rootKey, f.wpub, f.der, f.otherDER
	c := parse(t, der)
	if c.IsCA || c.KeyUsage != x509.KeyUsageDigitalSignature || c.URIs[0].String() != "spiffe://dev.bc.local/worker/worker-1" || !c.NotAfter.Equal(t0.Add(24*time.Hour)) {
		t.Fatalf("worker cert = %+v", c)
	}
	wrongTD, _ := IssueWorkerCert(b.CommandRoot, rootKey, "prod.bc.local", "worker-1", wpub, 24*time.Hour, t0)
	nodeID := craft(t, caPair{b.CommandRoot, rootKey}, &x509.Certificate{URIs: []*url.URL{NodeSPIFFEID(td, "worker-1")}, KeyUsage: x509.KeyUsageDigitalSignature, BasicConstraintsValid: true})
	gw := craft(t, caPair{b.CommandRoot, rootKey}, &x509.Certificate{URIs: []*url.URL{GatewaySPIFFEID(td)}, KeyUsage: x509.KeyUsageDigitalSignature, BasicConstraintsValid: true})
	ecWorker := craft(t, caPair{b.CommandRoot, rootKey}, &x509.Certificate{URIs: []*url.URL{WorkerSPIFFEID(td, "w")}, KeyUsage: x509.KeyUsageDigitalSignature, BasicConstraintsValid: true})
	var invalidCert x509.CertificateInvalidError
	var unknownAuth x509.UnknownAuthorityError
	tests := []struct {
		name    string
		der     []byte
		roots   []*x509.Certificate
		at      time.Time
		wantAs  any
		wantErr string
	}{
		{name: "valid", der: der, roots: []*x509.Certificate{b.CommandRoot}, at: t0.Add(23 * time.Hour)},
		{name: "valid among several roots", der: der, roots: []*x509.Certificate{other.CommandRoot, b.CommandRoot}, at: t0},
		{name: "wrong root", der: otherDER, roots: []*x509.Certificate{b.CommandRoot}, at: t0, wantAs: &unknownAuth},
		{name: "node CA is not a command root", der: der, roots: []*x509.Certificate{b.NodeCA}, at: t0, wantAs: &unknownAuth},
		{name: "expired", der: der, roots: []*x509.Certificate{b.CommandRoot}, at: t0.Add(24*time.Hour + time.Second), wantAs: &invalidCert},
		{name: "node SPIFFE ID", der: nodeID.Raw, roots: []*x509.Certificate{b.CommandRoot}, at: t0, wantErr: `pki: spiffe ID "spiffe://dev.bc.local/node/worker-1" is not a worker ID`},
		{name: "gateway SPIFFE ID", der: gw.Raw, roots: []*x509.Certificate{b.CommandRoot}, at: t0, wantErr: `pki: spiffe ID "spiffe://dev.bc.local/gateway" is not a worker ID`},
		{name: "wrong trust domain", der: wrongTD, roots: []*x509.Certificate{b.CommandRoot}, at: t0, wantErr: `pki: worker certificate is for trust domain "prod.bc.local", want "dev.bc.local"`},
		{name: "ECDSA worker key", der: ecWorker.Raw, roots: []*x509.Certificate{b.CommandRoot}, at: t0, wantErr: "pki: worker key is not Ed25519"},
		{name: "no roots", der: der, at: t0, wantErr: "pki: no command roots given"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pub, err := VerifyWorkerChain(tt.der, tt.roots, td, tt.at)
			switch {
			case tt.wantAs != nil:
				if !errors.As(err, tt.wantAs) {
					t.Fatalf("err = %v, want %T", err, tt.wantAs)
				}
			case tt.wantErr != "":
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
			default:
				if err != nil || !pub.Equal(wpub) {
					t.Fatalf("VerifyWorkerChain = %v", err)
				}
			}
		})
	}
	for _, lt := range []time.Duration{0, 48*time.Hour + 1} {
		if _, err := IssueWorkerCert(b.CommandRoot, rootKey, td, "w", wpub, lt, t0); err == nil {
			t.Errorf("lifetime %v accepted", lt)
		}
	}
	if _, err := IssueWorkerCert(b.CommandRoot, rootKey, td, "w", wpub[:31], time.Hour, t0); err == nil || err.Error() != "pki: worker key must be an Ed25519 public key" {
		t.Errorf("short key: %v", err)
	}
}

func TestPrivateKeyPEM(t *testing.T) {
	ec, _ := NewNodeKey()
	_, ed, _ := ed25519.GenerateKey(rand.Reader)
	for _, k := range []crypto.Signer{ec, ed} {
		p, err := MarshalPrivateKeyPEM(k)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParsePrivateKeyPEM(p)
		if err != nil {
			t.Fatal(err)
		}
		if !got.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(k.Public()) {
			t.Fatal("round trip changed the key")
		}
		if _, err := ParsePrivateKeyPEM(append(p, p...)); err == nil || err.Error() != "pki: expected exactly one PRIVATE KEY PEM block" {
			t.Fatalf("two blocks: %v", err)
		}
	}
	if _, err := ParsePrivateKeyPEM(CertPEM([]byte{1})); err == nil || err.Error() != "pki: expected exactly one PRIVATE KEY PEM block" {
		t.Fatalf("cert PEM: %v", err)
	}
}

func TestRoleExtensionOIDIsolated(t *testing.T) {
	if RoleExtensionOID.String() != "1.3.6.1.4.1.59999.1.1" {
		t.Fatal(RoleExtensionOID)
	}
	ca, _ := nodeCA(t)
	key, _ := NewNodeKey()
	der, err := IssueNodeCert(ca.cert, ca.key, mustCSR(t, key), td, "n1", RoleSite, time.Hour, t0)
	if err != nil {
		t.Fatal(err)
	}
	// Mutating the exported OID must not change what the package issues or accepts.
	saved := RoleExtensionOID[8]
	RoleExtensionOID[8] = 7
	defer func() { RoleExtensionOID[8] = saved }()
	if id, err := ParseNodeCert(parse(t, der)); err != nil || id.Role != RoleSite {
		t.Fatalf("after mutation: %+v, %v", id, err)
	}
	for _, r := range []string{"node", "ramdisk", "site", "node-tenant"} {
		if !ValidRole(r) {
			t.Errorf("%s invalid", r)
		}
	}
	for _, r := range []string{"", "Node", "admin", "node "} {
		if ValidRole(r) {
			t.Errorf("%q valid", r)
		}
	}
}

// workerChainFixture is what the worker-chain tests share: a bundle and its
// command-root key, another bundle, a worker key, and a worker certificate
// under the first root issued at t0 for 24 hours, with the same worker key
// under the other root.
type workerChainFixture struct {
	b, other      *Bundle
	rootKey       ed25519.PrivateKey
	wpub          ed25519.PublicKey
	der, otherDER []byte
}

func newWorkerChainFixture(t *testing.T) workerChainFixture {
	t.Helper()
	b, kek, _ := newBundle(t)
	rootKey, err := b.CommandRootKey(kek)
	if err != nil {
		t.Fatal(err)
	}
	other, okek, _ := newBundle(t)
	otherKey, err := other.CommandRootKey(okek)
	if err != nil {
		t.Fatal(err)
	}
	wpub, _, _ := ed25519.GenerateKey(rand.Reader)
	der, err := IssueWorkerCert(b.CommandRoot, rootKey, td, "worker-1", wpub, 24*time.Hour, t0)
	if err != nil {
		t.Fatal(err)
	}
	otherDER, err := IssueWorkerCert(other.CommandRoot, otherKey, td, "worker-1", wpub, 24*time.Hour, t0)
	if err != nil {
		t.Fatal(err)
	}
	return workerChainFixture{b: b, other: other, rootKey: rootKey, wpub: wpub, der: der, otherDER: otherDER}
}
