package daemon

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/bettercompute/bettercompute/internal/jointoken"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// verifyGateway checks a gateway's TLS chain against the pinned server
// roots and requires the gateway's SPIFFE ID.
func verifyGateway(rawCerts [][]byte, roots *x509.CertPool, trustDomain string) error {
	if len(rawCerts) == 0 {
		return errors.New("daemon: gateway sent no certificate")
	}
	certs := make([]*x509.Certificate, 0, len(rawCerts))
	for _, raw := range rawCerts {
		c, err := x509.ParseCertificate(raw)
		if err != nil {
			return fmt.Errorf("daemon: gateway certificate: %w", err)
		}
		certs = append(certs, c)
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return fmt.Errorf("daemon: gateway certificate does not verify: %w", err)
	}
	want := pki.GatewaySPIFFEID(trustDomain).String()
	if !slices.ContainsFunc(certs[0].URIs, func(u *url.URL) bool { return u.String() == want }) {
		return errors.New("daemon: gateway certificate lacks the gateway SPIFFE ID")
	}
	return nil
}

// JoinOptions are the inputs of Join. Token is the secret: it comes from
// BCD_JOIN_TOKEN or standard input, never an argument.
type JoinOptions struct {
	DataDir string
	Gateway string // host:port
	Token   string
	Name    string
}

// Join makes this node's key locally, checks the gateway against the pin
// in the token (before the token is sent), trades the token and a CSR for
// a certificate, and keeps the join record and identity (0600) in DataDir.
func Join(ctx context.Context, o JoinOptions) (*JoinRecord, error) {
	tok, err := jointoken.Parse(o.Token)
	if err != nil {
		return nil, errors.New("daemon: the join token is malformed")
	}
	if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("daemon: data dir: %w", err)
	}
	if Joined(o.DataDir) {
		return nil, fmt.Errorf("daemon: %s already holds a join record", o.DataDir)
	}
	// The gateway's chain is checked after the signed bundle arrives, on
	// the same connection, and before the token leaves this machine.
	var mu sync.Mutex
	var seen [][]byte
	tlsCfg := &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true, // verified below against the pinned bundle
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			mu.Lock()
			seen = raw
			mu.Unlock()
			return nil
		},
	}
	conn, err := grpc.NewClient(o.Gateway, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
	if err != nil {
		return nil, fmt.Errorf("daemon: dial gateway: %w", err)
	}
	defer conn.Close()
	cl := nodev1.NewGatewayClient(conn)
	sb, err := cl.Bundle(ctx, &nodev1.BundleRequest{})
	if err != nil {
		return nil, fmt.Errorf("daemon: fetch trust bundle: %w", err)
	}
	joinPub := ed25519.PublicKey(sb.JoinPublicKey)
	tb, err := pki.VerifyTrustBundle(sb.Body, sb.Signature, joinPub, tok.Pin)
	if err != nil {
		return nil, fmt.Errorf("daemon: trust bundle does not match the token's pin: %w", err)
	}
	serverRoots, err := tb.ServerRootPool()
	if err != nil {
		return nil, fmt.Errorf("daemon: server roots: %w", err)
	}
	mu.Lock()
	raw := seen
	mu.Unlock()
	if err := verifyGateway(raw, serverRoots, tb.TrustDomain); err != nil {
		return nil, err
	}
	key, err := pki.NewNodeKey()
	if err != nil {
		return nil, fmt.Errorf("daemon: node key: %w", err)
	}
	csr, err := pki.CSR(key, o.Name)
	if err != nil {
		return nil, fmt.Errorf("daemon: csr: %w", err)
	}
	resp, err := cl.Join(ctx, &nodev1.JoinRequest{Token: tok.String(), CsrDer: csr, Name: o.Name})
	if err != nil {
		return nil, fmt.Errorf("daemon: join refused: %w", err)
	}
	// The answer's bundle must be the one we pinned.
	if resp.Bundle == nil || subtle.ConstantTimeCompare(sha256sum(resp.Bundle.Body), sha256sum(sb.Body)) != 1 {
		return nil, errors.New("daemon: join answer carries another trust bundle")
	}
	roots, err := tb.NodeRootPool()
	if err != nil {
		return nil, fmt.Errorf("daemon: node roots: %w", err)
	}
	var chain []*x509.Certificate
	for _, der := range resp.CertChainDer {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("daemon: issued certificate: %w", err)
		}
		chain = append(chain, c)
	}
	nid, err := pki.VerifyNodeChain(chain, roots, tb.TrustDomain, chain[0].NotBefore.Add(1))
	if err != nil || nid.NodeID != resp.NodeId {
		return nil, fmt.Errorf("daemon: issued certificate does not verify: %w", err)
	}
	if !key.PublicKey.Equal(chain[0].PublicKey) {
		return nil, errors.New("daemon: issued certificate is for another key")
	}
	keyPEM, err := pki.MarshalPrivateKeyPEM(key)
	if err != nil {
		return nil, fmt.Errorf("daemon: encode key: %w", err)
	}
	if err := writeJSON(o.DataDir, identityFile, identity{KeyPEM: keyPEM, Chain: resp.CertChainDer}); err != nil {
		return nil, err
	}
	rec := &JoinRecord{NodeID: resp.NodeId, Gateway: o.Gateway, Pin: tok.Pin[:], JoinPublicKey: joinPub, BundleBody: sb.Body, BundleSig: sb.Signature}
	if err := writeJSON(o.DataDir, joinFile, rec); err != nil {
		return nil, err
	}
	return rec, nil
}

func sha256sum(b []byte) []byte {
	h := sha256.Sum256(b)
	return h[:]
}
