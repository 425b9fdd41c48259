package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
)

// Files `pki issue-gateway` writes for a gateway process: the bundle's
// public half (no sealed key) and the gateway's own certificate and key.
const (
	GatewayCertFile = "gateway.crt"
	GatewayKeyFile  = "gateway.key"
)

// ControlSPIFFEID is the identity of the api role on the control plane's
// internal channel: spiffe://<td>/control.
func ControlSPIFFEID(trustDomain string) *url.URL { return spiffeID(trustDomain, "control") }

// IssueGatewayCert makes a fresh ECDSA P-256 key and a certificate for a
// gateway process from the internal CA: URI SAN GatewaySPIFFEID, the given
// DNS and IP SANs, usable both as the node-facing TLS server certificate
// and as the client certificate on the internal channel.
func IssueGatewayCert(caCert *x509.Certificate, caKey crypto.Signer, trustDomain string, dnsNames []string, ips []net.IP, lifetime time.Duration, now time.Time) (tls.Certificate, error) {
	return issueInternal(caCert, caKey, trustDomain, GatewaySPIFFEID(trustDomain), "gateway."+trustDomain, dnsNames, ips, lifetime, now,
		[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth})
}

// IssueControlCert makes the api role's server certificate for the
// internal channel: URI SAN ControlSPIFFEID, server authentication only.
func IssueControlCert(caCert *x509.Certificate, caKey crypto.Signer, trustDomain string, dnsNames []string, ips []net.IP, lifetime time.Duration, now time.Time) (tls.Certificate, error) {
	return issueInternal(caCert, caKey, trustDomain, ControlSPIFFEID(trustDomain), "control."+trustDomain, dnsNames, ips, lifetime, now,
		[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth})
}

func issueInternal(caCert *x509.Certificate, caKey crypto.Signer, trustDomain string, id *url.URL, cn string, dnsNames []string, ips []net.IP,
	lifetime time.Duration, now time.Time, eku []x509.ExtKeyUsage) (tls.Certificate, error) {
	if err := checkIssuer(caCert, caKey); err != nil {
		return tls.Certificate{}, err
	}
	if err := ValidateTrustDomain(trustDomain); err != nil {
		return tls.Certificate{}, err
	}
	if err := checkLifetime("internal", lifetime, MaxServerCertLifetime, now, caCert); err != nil {
		return tls.Certificate{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("pki: generate key: %w", err)
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		URIs:        []*url.URL{id},
		DNSNames:    append([]string(nil), dnsNames...),
		IPAddresses: append([]net.IP(nil), ips...),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: eku,
	}
	der, err := sign(tmpl, caCert, key.Public(), caKey, now, lifetime)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("pki: parse certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// VerifyInternalPeer checks a peer on the internal channel: the leaf
// chains to one of the internal CAs (Bundle.InternalRoots: active, staged,
// previous) for usage at now and its only URI SAN is want.
func VerifyInternalPeer(rawCerts [][]byte, internalCAs []*x509.Certificate, want *url.URL, usage x509.ExtKeyUsage, now time.Time) error {
	if len(rawCerts) == 0 {
		return errors.New("pki: no peer certificate")
	}
	leaf, err := x509.ParseCertificate(rawCerts[0])
	if err != nil {
		return fmt.Errorf("pki: parse peer certificate: %w", err)
	}
	roots := x509.NewCertPool()
	for _, ca := range internalCAs {
		roots.AddCert(ca)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return fmt.Errorf("pki: peer certificate does not verify: %w", err)
	}
	// An X.509-SVID carries exactly one URI SAN, a SPIFFE ID (x509svid).
	got, err := x509svid.IDFromCert(leaf)
	if err != nil {
		return fmt.Errorf("pki: peer is not %s: %w", want, err)
	}
	if wantID, err := spiffeid.FromURI(want); err != nil || got != wantID {
		return fmt.Errorf("pki: peer is not %s", want)
	}
	return nil
}

// WriteGatewayFiles writes what a gateway process needs into dir (made
// 0700): the bundle's public half as bundle.json (certificates and public
// keys, no sealed key), gateway.crt and gateway.key (0600).
func (b *Bundle) WriteGatewayFiles(dir string, cert tls.Certificate) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("pki: create %s: %w", dir, err)
	}
	pub := *b
	pub.sealed = nil
	if err := pub.write(filepath.Join(dir, BundleFile), false); err != nil {
		return err
	}
	keyPEM, err := MarshalPrivateKeyPEM(cert.PrivateKey.(crypto.Signer))
	if err != nil {
		return err
	}
	defer clear(keyPEM)
	if err := WriteFileAtomic(filepath.Join(dir, GatewayKeyFile), keyPEM, 0o600); err != nil {
		return err
	}
	var chain []byte
	for _, der := range cert.Certificate {
		chain = append(chain, CertPEM(der)...)
	}
	return WriteFileAtomic(filepath.Join(dir, GatewayCertFile), chain, 0o644)
}

// LoadGatewayCert reads a certificate chain PEM and its key PEM (0600, as
// WriteGatewayFiles writes them).
func LoadGatewayCert(certFile, keyFile string) (tls.Certificate, error) {
	if fi, err := os.Stat(keyFile); err != nil {
		return tls.Certificate{}, fmt.Errorf("pki: %w", err)
	} else if fi.Mode().Perm()&0o077 != 0 {
		return tls.Certificate{}, fmt.Errorf("pki: %s is readable or writable by group or other", keyFile)
	}
	c, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("pki: gateway certificate: %w", err)
	}
	return c, nil
}

// Public reports whether b is a bundle's public half (loaded by LoadPublic
// from a directory that holds no sealed key): nothing in it can be
// unsealed.
func (b *Bundle) Public() bool { return len(b.sealed) == 0 }

// LoadPublic reads dir/bundle.json as Load does, but accepts the public
// half `pki issue-gateway` writes (no sealed key at all), and keeps no
// sealed key in memory even when the file holds them.
func LoadPublic(dir string) (*Bundle, error) {
	b, err := load(dir, true)
	if err != nil {
		return nil, err
	}
	b.sealed = nil
	return b, nil
}
