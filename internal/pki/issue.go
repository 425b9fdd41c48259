package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"time"
)

// Certificate lifetime limits and the backdating applied to NotBefore to
// tolerate small clock skew between the control plane and nodes.
const (
	MaxNodeCertLifetime   = 30 * 24 * time.Hour
	MaxWorkerCertLifetime = 48 * time.Hour
	MaxServerCertLifetime = 398 * 24 * time.Hour
	clockSkew             = time.Minute
)

// randomSerial returns a random positive 128-bit serial number.
func randomSerial() (*big.Int, error) {
	limit := new(big.Int).Lsh(big.NewInt(1), 128)
	for {
		n, err := rand.Int(rand.Reader, limit)
		if err != nil {
			return nil, fmt.Errorf("pki: serial: %w", err)
		}
		if n.Sign() > 0 {
			return n, nil
		}
	}
}

func checkIssuer(ca *x509.Certificate, key any) error {
	if ca == nil || key == nil {
		return errors.New("pki: issuer certificate and key are required")
	}
	if !ca.BasicConstraintsValid || !ca.IsCA {
		return errors.New("pki: issuer certificate is not a CA")
	}
	return nil
}

func checkLifetime(kind string, lifetime, max time.Duration, now time.Time, ca *x509.Certificate) error {
	if lifetime <= 0 || lifetime > max {
		return fmt.Errorf("pki: %s certificate lifetime %v must be > 0 and <= %v", kind, lifetime, max)
	}
	if now.IsZero() {
		return errors.New("pki: issuance time not set")
	}
	if now.Add(lifetime).After(ca.NotAfter) {
		return fmt.Errorf("pki: %s certificate would outlive its CA (CA expires %s)", kind, ca.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// sign creates a certificate from tmpl for pub, signed by ca/caKey, with a
// fresh serial and validity [now-skew, now+lifetime].
func sign(tmpl *x509.Certificate, ca *x509.Certificate, pub, caKey any, now time.Time, lifetime time.Duration) ([]byte, error) {
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = now.Add(-clockSkew)
	tmpl.NotAfter = now.Add(lifetime)
	tmpl.BasicConstraintsValid = true
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, pub, caKey)
	if err != nil {
		return nil, fmt.Errorf("pki: sign certificate: %w", err)
	}
	return der, nil
}

// IssueNodeCert signs a node client certificate for the public key in csrDER
// (whose signature must verify; ECDSA P-256 or Ed25519 only). Only the key is
// taken from the CSR: the subject CN is nodeID, the single URI SAN is
// NodeSPIFFEID and the role goes in the role extension. NotBefore is now-1m,
// NotAfter now+lifetime (0 < lifetime <= 30 days). Returns the leaf DER.
func IssueNodeCert(caCert *x509.Certificate, caKey crypto.Signer, csrDER []byte, trustDomain, nodeID, role string, lifetime time.Duration, now time.Time) ([]byte, error) {
	if err := checkIssuer(caCert, caKey); err != nil {
		return nil, err
	}
	if err := ValidateTrustDomain(trustDomain); err != nil {
		return nil, err
	}
	if !ValidNodeID(nodeID) {
		return nil, fmt.Errorf("pki: invalid node id %q", nodeID)
	}
	if !ValidRole(role) {
		return nil, fmt.Errorf("pki: invalid role %q", role)
	}
	if err := checkLifetime("node", lifetime, MaxNodeCertLifetime, now, caCert); err != nil {
		return nil, err
	}
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, fmt.Errorf("pki: parse CSR: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("pki: CSR signature: %w", err)
	}
	switch k := csr.PublicKey.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return nil, errors.New("pki: CSR key must be ECDSA P-256 or Ed25519")
		}
	case ed25519.PublicKey:
	default:
		return nil, errors.New("pki: CSR key must be ECDSA P-256 or Ed25519")
	}
	ext, err := roleExtension(role)
	if err != nil {
		return nil, fmt.Errorf("pki: role extension: %w", err)
	}
	tmpl := &x509.Certificate{
		Subject:         pkix.Name{CommonName: nodeID},
		URIs:            []*url.URL{NodeSPIFFEID(trustDomain, nodeID)},
		ExtraExtensions: []pkix.Extension{{Id: roleOID(), Value: ext}},
		KeyUsage:        x509.KeyUsageDigitalSignature,
		ExtKeyUsage:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	return sign(tmpl, caCert, csr.PublicKey, caKey, now, lifetime)
}

// IssueServerCert makes a fresh ECDSA P-256 key and a TLS server certificate
// for it from the internal CA: URI SAN GatewaySPIFFEID, the given DNS and IP
// SANs, ExtKeyUsageServerAuth, lifetime (0 < lifetime <= 398 days). The
// returned tls.Certificate holds the leaf only (nodes pin the internal CA)
// with Leaf parsed.
func IssueServerCert(caCert *x509.Certificate, caKey crypto.Signer, trustDomain string, dnsNames []string, ips []net.IP, lifetime time.Duration, now time.Time) (tls.Certificate, error) {
	if err := checkIssuer(caCert, caKey); err != nil {
		return tls.Certificate{}, err
	}
	if err := ValidateTrustDomain(trustDomain); err != nil {
		return tls.Certificate{}, err
	}
	if err := checkLifetime("server", lifetime, MaxServerCertLifetime, now, caCert); err != nil {
		return tls.Certificate{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("pki: generate server key: %w", err)
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "gateway." + trustDomain},
		URIs:        []*url.URL{GatewaySPIFFEID(trustDomain)},
		DNSNames:    append([]string(nil), dnsNames...),
		IPAddresses: append([]net.IP(nil), ips...),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := sign(tmpl, caCert, key.Public(), caKey, now, lifetime)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("pki: parse server certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// IssueWorkerCert certifies an Ed25519 worker public key with the command
// root: single URI SAN spiffe://<td>/worker/<workerID>, KeyUsageDigitalSignature,
// not a CA, NotAfter = now+lifetime (0 < lifetime <= 48h). Worker keys sign
// commands; the short lifetime bounds the damage of a stolen worker key.
func IssueWorkerCert(root *x509.Certificate, rootKey ed25519.PrivateKey, trustDomain, workerID string, pub ed25519.PublicKey, lifetime time.Duration, now time.Time) ([]byte, error) {
	if len(rootKey) != ed25519.PrivateKeySize {
		return nil, errors.New("pki: command root key must be an Ed25519 private key")
	}
	if err := checkIssuer(root, rootKey); err != nil {
		return nil, err
	}
	if err := ValidateTrustDomain(trustDomain); err != nil {
		return nil, err
	}
	if !ValidNodeID(workerID) {
		return nil, fmt.Errorf("pki: invalid worker id %q", workerID)
	}
	if len(pub) != ed25519.PublicKeySize {
		return nil, errors.New("pki: worker key must be an Ed25519 public key")
	}
	if err := checkLifetime("worker", lifetime, MaxWorkerCertLifetime, now, root); err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		Subject:  pkix.Name{CommonName: "worker " + workerID},
		URIs:     []*url.URL{WorkerSPIFFEID(trustDomain, workerID)},
		KeyUsage: x509.KeyUsageDigitalSignature,
	}
	return sign(tmpl, root, pub, rootKey, now, lifetime)
}

// VerifyWorkerChain checks that workerDER chains to one of commandRoots at
// time at, carries exactly one worker SPIFFE ID in trustDomain, permits
// digital signatures, is not a CA and holds an Ed25519 key, which it returns.
func VerifyWorkerChain(workerDER []byte, commandRoots []*x509.Certificate, trustDomain string, at time.Time) (ed25519.PublicKey, error) {
	pub, _, err := verifyWorkerChain(workerDER, commandRoots, trustDomain, at)
	return pub, err
}

// verifyWorkerChain is VerifyWorkerChain that also returns the chain that
// verified (leaf first, root last), from which WorkerChainCache takes the
// validity window of its answer.
func verifyWorkerChain(workerDER []byte, commandRoots []*x509.Certificate, trustDomain string, at time.Time) (ed25519.PublicKey, []*x509.Certificate, error) {
	if len(commandRoots) == 0 {
		return nil, nil, errors.New("pki: no command roots given")
	}
	if at.IsZero() {
		return nil, nil, errors.New("pki: verification time not set")
	}
	cert, err := x509.ParseCertificate(workerDER)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: parse worker certificate: %w", err)
	}
	roots := x509.NewCertPool()
	for _, r := range commandRoots {
		if r != nil {
			roots.AddCert(r)
		}
	}
	chains, err := cert.Verify(x509.VerifyOptions{
		Roots: roots, CurrentTime: at,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	if err != nil {
		return nil, nil, fmt.Errorf("pki: worker certificate does not verify: %w", err)
	}
	if cert.IsCA || cert.KeyUsage&x509.KeyUsageDigitalSignature == 0 {
		return nil, nil, errors.New("pki: worker certificate is not a signing leaf")
	}
	if len(cert.URIs) != 1 {
		return nil, nil, fmt.Errorf("pki: worker certificate must have exactly one URI SAN, has %d", len(cert.URIs))
	}
	td, _, err := parseSPIFFEID(cert.URIs[0], "worker")
	if err != nil {
		return nil, nil, err
	}
	if td != trustDomain {
		return nil, nil, fmt.Errorf("pki: worker certificate is for trust domain %q, want %q", td, trustDomain)
	}
	pub, ok := cert.PublicKey.(ed25519.PublicKey)
	if !ok {
		return nil, nil, errors.New("pki: worker key is not Ed25519")
	}
	return pub, chains[0], nil
}

// NewNodeKey makes the ECDSA P-256 key a node authenticates with.
func NewNodeKey() (*ecdsa.PrivateKey, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: generate node key: %w", err)
	}
	return k, nil
}

// CSR makes a certificate signing request DER for key with subject CN=cn.
// The CN is informational only: the issuer sets the identity itself.
func CSR(key crypto.Signer, cn string) ([]byte, error) {
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn}}, key)
	if err != nil {
		return nil, fmt.Errorf("pki: create CSR: %w", err)
	}
	return der, nil
}

// MarshalPrivateKeyPEM encodes key as a PKCS#8 "PRIVATE KEY" PEM block, for
// the node's own key file (which is not sealed; the daemon writes it 0600).
func MarshalPrivateKeyPEM(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("pki: marshal private key: %w", err)
	}
	defer clear(der)
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParsePrivateKeyPEM parses a PKCS#8 "PRIVATE KEY" PEM block holding an ECDSA
// or Ed25519 key, as written by MarshalPrivateKeyPEM.
func ParsePrivateKeyPEM(data []byte) (crypto.Signer, error) {
	block, rest := pem.Decode(data)
	if block == nil || block.Type != "PRIVATE KEY" || len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.New("pki: expected exactly one PRIVATE KEY PEM block")
	}
	defer clear(block.Bytes)
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, errors.New("pki: private key PEM does not hold a PKCS#8 key")
	}
	switch k := key.(type) {
	case *ecdsa.PrivateKey:
		return k, nil
	case ed25519.PrivateKey:
		return k, nil
	}
	return nil, errors.New("pki: private key must be ECDSA or Ed25519")
}

// CertPEM encodes a certificate DER as a "CERTIFICATE" PEM block.
func CertPEM(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
