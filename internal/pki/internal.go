package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
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

// InternalPeerVerifier is VerifyInternalPeer for one set of internal CAs,
// one expected identity and one usage, remembering the chains it
// accepted: the api checks the gateway's certificate on every internal
// call (a connection outlives a certificate's validity), and verifying
// the chain each time was an eighth of the api's CPU during joins. A
// remembered chain is accepted again only within the validity window of
// every certificate of the chain it verified under; outside it, and for
// any chain not accepted before, it verifies in full. Refusals are never
// remembered.
type InternalPeerVerifier struct {
	cas   []*x509.Certificate
	want  *url.URL
	usage x509.ExtKeyUsage
	mu    sync.Mutex
	seen  map[[32]byte]validity // SHA-256 of the leaf's DER -> window
}

// validity is when a verified chain stays valid: the latest NotBefore and
// the earliest NotAfter of its certificates.
type validity struct{ from, until time.Time }

// maxRememberedPeers bounds the memo; a full memo starts over (there are
// as many entries as gateway certificates in use, a handful).
const maxRememberedPeers = 64

// NewInternalPeerVerifier returns a verifier of peers with identity want
// and usage under internalCAs (fixed for its life).
func NewInternalPeerVerifier(internalCAs []*x509.Certificate, want *url.URL, usage x509.ExtKeyUsage) *InternalPeerVerifier {
	return &InternalPeerVerifier{cas: internalCAs, want: want, usage: usage, seen: map[[32]byte]validity{}}
}

// Verify is VerifyInternalPeer(rawCerts, v's CAs, identity and usage, now).
func (v *InternalPeerVerifier) Verify(rawCerts [][]byte, now time.Time) error {
	if len(rawCerts) == 0 {
		return errors.New("pki: no peer certificate")
	}
	key := sha256.Sum256(rawCerts[0])
	v.mu.Lock()
	w, ok := v.seen[key]
	v.mu.Unlock()
	if ok && !now.Before(w.from) && !now.After(w.until) {
		return nil
	}
	chain, err := verifyInternalPeer(rawCerts, v.cas, v.want, v.usage, now)
	if err != nil {
		return err
	}
	w.from, w.until = chainValidity(chain)
	v.mu.Lock()
	if len(v.seen) >= maxRememberedPeers {
		clear(v.seen)
	}
	v.seen[key] = w
	v.mu.Unlock()
	return nil
}

// chainValidity is when every certificate of chain is valid: the latest
// NotBefore and the earliest NotAfter (a memo of a verified chain holds
// only within it).
func chainValidity(chain []*x509.Certificate) (from, until time.Time) {
	from, until = chain[0].NotBefore, chain[0].NotAfter
	for _, c := range chain[1:] {
		if c.NotBefore.After(from) {
			from = c.NotBefore
		}
		if c.NotAfter.Before(until) {
			until = c.NotAfter
		}
	}
	return from, until
}

// VerifyInternalPeer checks a peer on the internal channel: the leaf
// chains to one of the internal CAs (Bundle.InternalRoots: active, staged,
// previous) for usage at now and its only URI SAN is want.
func VerifyInternalPeer(rawCerts [][]byte, internalCAs []*x509.Certificate, want *url.URL, usage x509.ExtKeyUsage, now time.Time) error {
	_, err := verifyInternalPeer(rawCerts, internalCAs, want, usage, now)
	return err
}

// verifyInternalPeer is VerifyInternalPeer, returning the verified chain
// (leaf first).
func verifyInternalPeer(rawCerts [][]byte, internalCAs []*x509.Certificate, want *url.URL, usage x509.ExtKeyUsage, now time.Time) ([]*x509.Certificate, error) {
	if len(rawCerts) == 0 {
		return nil, errors.New("pki: no peer certificate")
	}
	leaf, err := x509.ParseCertificate(rawCerts[0])
	if err != nil {
		return nil, fmt.Errorf("pki: parse peer certificate: %w", err)
	}
	roots := x509.NewCertPool()
	for _, ca := range internalCAs {
		roots.AddCert(ca)
	}
	chains, err := leaf.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{usage}})
	if err != nil {
		return nil, fmt.Errorf("pki: peer certificate does not verify: %w", err)
	}
	// An X.509-SVID carries exactly one URI SAN, a SPIFFE ID (x509svid).
	got, err := x509svid.IDFromCert(leaf)
	if err != nil {
		return nil, fmt.Errorf("pki: peer is not %s: %w", want, err)
	}
	if wantID, err := spiffeid.FromURI(want); err != nil || got != wantID {
		return nil, fmt.Errorf("pki: peer is not %s", want)
	}
	return chains[0], nil
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
