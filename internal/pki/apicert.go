package pki

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/url"
	"time"
)

// APICAFile is the name dev gives the PEM of the CA the public API's
// certificate chains to (the internal CA), for BC_CA_FILE.
const APICAFile = "api-ca.pem"

// APISPIFFEID is the identity of the public API's TLS server certificate:
// spiffe://<td>/api.
func APISPIFFEID(trustDomain string) *url.URL { return spiffeID(trustDomain, "api") }

// IssueAPICert makes a fresh ECDSA P-256 key and the public API's TLS
// server certificate from the internal CA: URI SAN APISPIFFEID, the given
// DNS and IP SANs, server authentication only. Clients verify it against
// the internal CA from the bundle's public half (APICAPEM).
func IssueAPICert(caCert *x509.Certificate, caKey crypto.Signer, trustDomain string, dnsNames []string, ips []net.IP, lifetime time.Duration, now time.Time) (tls.Certificate, error) {
	return issueInternal(caCert, caKey, trustDomain, APISPIFFEID(trustDomain), "api."+trustDomain, dnsNames, ips, lifetime, now,
		[]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth})
}

// APICAPEM is the PEM of the CAs that issue the public API's certificate
// (IssueAPICert): what a client such as the CLI trusts (BC_CA_FILE). While
// the internal CA rotates it holds every trusted one (active, staged,
// previous), so a client keeps working across the switch.
func (b *Bundle) APICAPEM() []byte {
	var out []byte
	for _, c := range b.InternalRoots() {
		out = append(out, CertPEM(c.Raw)...)
	}
	return out
}
