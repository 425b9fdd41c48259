package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"net"
	"net/url"
	"testing"
	"time"
)

// csrSeeds are certificate requests a joining or renewing node might send:
// plain ones of each accepted key type, one asking for more than the
// issuer gives (another node's SPIFFE ID, DNS and IP names, another
// role, a CA), keys the issuer refuses, and a request whose
// signature does not verify.
func csrSeeds(f testing.TB) [][]byte {
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	_, ed, _ := ed25519.GenerateKey(rand.Reader)
	rsaKey, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		f.Fatal(err)
	}
	other, _ := url.Parse("spiffe://" + td + "/node/n2")
	role, _ := roleExtension(RoleSite)
	ca, _ := asn1.Marshal(struct{ IsCA bool }{true})
	greedy := &x509.CertificateRequest{Subject: pkix.Name{CommonName: "n2"}, URIs: []*url.URL{other}, DNSNames: []string{"gateway." + td},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, EmailAddresses: []string{"a@b"},
		ExtraExtensions: []pkix.Extension{{Id: roleOID(), Value: role}, {Id: asn1.ObjectIdentifier{2, 5, 29, 19}, Critical: true, Value: ca}}}
	var out [][]byte
	for _, c := range []struct {
		key  crypto.Signer
		tmpl *x509.CertificateRequest
	}{
		{p256, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "n1"}}},
		{ed, &x509.CertificateRequest{}},
		{p256, greedy},
		{p384, &x509.CertificateRequest{}},
		{rsaKey, &x509.CertificateRequest{}},
	} {
		der, err := x509.CreateCertificateRequest(rand.Reader, c.tmpl, c.key)
		if err != nil {
			f.Fatal(err)
		}
		out = append(out, der)
	}
	bad := bytes.Clone(out[0])
	bad[len(bad)-3] ^= 1
	return append(out, bad, []byte{0x30, 0x03, 0x02, 0x01, 0x00})
}

// FuzzIssueNodeCert feeds arbitrary certificate requests, as a node sends
// them to join or renew, to IssueNodeCert. No request panics; one is
// certified exactly when it parses, its signature verifies and its key is
// ECDSA P-256 or Ed25519; and the certificate says only what the issuer
// decided, whatever the request asked for: the node's SPIFFE ID as its one
// name, the role given, the request's key, client authentication only, not
// a CA, and it verifies under the node CA.
func FuzzIssueNodeCert(f *testing.F) {
	b, kek, _ := newBundle(f)
	caKey, err := b.NodeCAKey(kek)
	if err != nil {
		f.Fatal(err)
	}
	now := t0.Add(time.Hour)
	for _, der := range csrSeeds(f) {
		f.Add(der)
	}
	roots := x509.NewCertPool()
	roots.AddCert(b.NodeCA)
	f.Fuzz(func(t *testing.T, csrDER []byte) {
		want := false
		csr, perr := x509.ParseCertificateRequest(csrDER)
		if perr == nil && csr.CheckSignature() == nil {
			switch k := csr.PublicKey.(type) {
			case *ecdsa.PublicKey:
				want = k.Curve == elliptic.P256()
			case ed25519.PublicKey:
				want = true
			}
		}
		der, err := IssueNodeCert(b.NodeCA, caKey, csrDER, b.TrustDomain, "n1", RoleNode, 24*time.Hour, now)
		if (err == nil) != want {
			t.Fatalf("issued %v (err %v), want issued %v", err == nil, err, want)
		}
		if err != nil {
			return
		}
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatalf("issued certificate does not parse: %v", err)
		}
		id, err := ParseNodeCert(cert)
		if err != nil || id.NodeID != "n1" || id.Role != RoleNode || id.TrustDomain != b.TrustDomain {
			t.Fatalf("issued identity %+v (%v)", id, err)
		}
		pub, ok := cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
		if !ok || !pub.Equal(csr.PublicKey) {
			t.Fatal("issued certificate is not for the request's key")
		}
		if cert.IsCA || len(cert.DNSNames)+len(cert.IPAddresses)+len(cert.EmailAddresses) != 0 || cert.Subject.CommonName != "n1" ||
			len(cert.ExtKeyUsage) != 1 || cert.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth || cert.KeyUsage != x509.KeyUsageDigitalSignature {
			t.Fatalf("issued certificate carries what the issuer did not decide: CA %v, CN %q, DNS %v, IP %v, email %v, key usage %v %v",
				cert.IsCA, cert.Subject.CommonName, cert.DNSNames, cert.IPAddresses, cert.EmailAddresses, cert.KeyUsage, cert.ExtKeyUsage)
		}
		if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Fatalf("issued certificate does not verify under the node CA: %v", err)
		}
	})
}
