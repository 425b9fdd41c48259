package client

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/internal/pki"
)

// ErrUntrustedServer is the error of a call to a server whose TLS
// certificate does not verify against the CA the client trusts (another
// control plane, or someone in the middle). Test for it with errors.Is.
var ErrUntrustedServer = errors.New("the server's TLS certificate is not from the control plane's CA: check BC_ADDR, and BC_CA_FILE or --ca-file (the PKI bundle directory or its API CA PEM)")

// CheckURL refuses a base URL the client would send an API key over in
// clear: it must be https://HOST[:PORT], or http:// to a loopback address.
func CheckURL(base string) error {
	u, err := url.Parse(base)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return fmt.Errorf("the API URL %q must be https://HOST:PORT (such as https://127.0.0.1:7780)", base)
	}
	if u.Scheme == "http" && !loopbackHost(u.Hostname()) {
		return fmt.Errorf("the API URL %q is plain http:// to a non-loopback host, which would send the API key in clear: use https://", base)
	}
	return nil
}

func loopbackHost(h string) bool {
	if strings.EqualFold(h, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(h)
	return err == nil && a.Unmap().IsLoopback()
}

// LoadRoots reads the CA the client trusts from path: a PEM file of
// certificates, or a PKI bundle directory (its public half is enough),
// whose API CAs (every trusted internal CA, so a client works across the
// internal CA's rotation) are taken.
func LoadRoots(path string) (*x509.CertPool, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if fi.IsDir() {
		b, err := pki.LoadPublic(path)
		if err != nil {
			return nil, fmt.Errorf("CA file: %w", err)
		}
		for _, ca := range b.InternalRoots() {
			pool.AddCert(ca)
		}
		return pool, nil
	}
	pemBytes, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("CA file: %w", err)
	}
	if !pool.AppendCertsFromPEM(pemBytes) {
		return nil, fmt.Errorf("CA file %s holds no PEM certificate", path)
	}
	return pool, nil
}

// NewTLS returns a client for baseURL (checked by CheckURL) that verifies
// an https:// server against roots only (never the system roots, never
// skipping verification). roots may be nil only for a loopback http://
// URL.
func NewTLS(baseURL, key string, roots *x509.CertPool) (*Client, error) {
	if err := CheckURL(baseURL); err != nil {
		return nil, err
	}
	c := New(baseURL, key)
	if strings.HasPrefix(baseURL, "http://") {
		return c, nil
	}
	if roots == nil {
		return nil, errors.New("an https:// API URL needs the control plane's CA: set BC_CA_FILE or --ca-file (the PKI bundle directory or its API CA PEM)")
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	c.HTTP = &http.Client{Timeout: 60 * time.Second, Transport: untrustedWrapper{t}, CheckRedirect: noRedirects}
	return c, nil
}

// newFromEnv is FromEnvCA's client for addr and key, trusting caFile
// (BC_CA_FILE when "").
func newFromEnv(addr, key, caFile string) (*Client, error) {
	if caFile == "" {
		caFile = os.Getenv("BC_CA_FILE")
	}
	var roots *x509.CertPool
	if caFile != "" {
		var err error
		if roots, err = LoadRoots(caFile); err != nil {
			return nil, err
		}
	}
	return NewTLS(addr, key, roots)
}

// untrustedWrapper turns a certificate verification failure into
// ErrUntrustedServer, with the reason.
type untrustedWrapper struct{ base http.RoundTripper }

func (u untrustedWrapper) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := u.base.RoundTrip(r)
	if err == nil {
		return resp, nil
	}
	var unknown x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	var host x509.HostnameError
	var verify *tls.CertificateVerificationError
	if errors.As(err, &unknown) || errors.As(err, &invalid) || errors.As(err, &host) || errors.As(err, &verify) {
		return nil, fmt.Errorf("%w (%v)", ErrUntrustedServer, err)
	}
	return nil, err
}
