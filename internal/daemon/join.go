package daemon

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"

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
	// An X.509-SVID names exactly one SPIFFE ID.
	if len(certs[0].URIs) != 1 || !slices.ContainsFunc(certs[0].URIs, func(u *url.URL) bool { return u.String() == want }) {
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
//
// The signed trust bundle is fetched on a first connection, which carries
// nothing secret, and checked under the pin; the token then goes only on a
// second connection whose TLS handshakes (every one, reconnects included)
// must verify to the bundle's server roots with the gateway SPIFFE ID.
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
	sb, tb, used, err := fetchBundle(ctx, o.Gateway, tok.Pin)
	if err != nil {
		return nil, err
	}
	serverRoots, err := tb.ServerRootPool()
	if err != nil {
		return nil, fmt.Errorf("daemon: server roots: %w", err)
	}
	// The token travels only on a new connection whose every handshake
	// (the first and any reconnect gRPC makes) is checked inside the TLS
	// handshake against the bundle's server roots and the gateway SPIFFE
	// ID: a handshake that fails ends before a byte of the request is
	// written, so no other server can ever read the token.
	conn, err := grpc.NewClient(o.Gateway, grpc.WithTransportCredentials(credentials.NewTLS(pinnedGatewayTLS(serverRoots, tb.TrustDomain))))
	if err != nil {
		return nil, fmt.Errorf("daemon: dial gateway: %w", err)
	}
	defer conn.Close()
	cl := nodev1.NewGatewayClient(conn)
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
		return nil, fmt.Errorf("daemon: join failed (the token was sent only if the gateway's certificate verified): %w", err)
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
	rec := &JoinRecord{NodeID: resp.NodeId, Gateway: o.Gateway, Pin: tok.Pin[:], JoinPublicKey: used.Key, BundleBody: sb.Body,
		BundleSig: used.Sig}
	if err := writeJSON(o.DataDir, joinFile, rec); err != nil {
		return nil, err
	}
	return rec, nil
}

// fetchBundle asks the gateway at addr for its signed trust bundle on a
// connection of its own and checks it under the token's pin: the active
// join key's signature or, while the join key rotates, another join key's
// (a token made before an activation pins the now previous key). It
// returns the join key's signature that verified. Nothing
// secret is sent on that connection: the gateway's certificate cannot be
// judged before the bundle is known, so the connection is closed once the
// bundle is in hand and never carries the token.
func fetchBundle(ctx context.Context, addr string, pin [32]byte) (*nodev1.SignedTrustBundle, pki.TrustBundle, pki.JoinSignature, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true, // only the signed bundle is read here, and it is checked under the pin
	})))
	if err != nil {
		return nil, pki.TrustBundle{}, pki.JoinSignature{}, fmt.Errorf("daemon: dial gateway: %w", err)
	}
	defer conn.Close()
	sb, err := nodev1.NewGatewayClient(conn).Bundle(ctx, &nodev1.BundleRequest{})
	if err != nil {
		return nil, pki.TrustBundle{}, pki.JoinSignature{}, fmt.Errorf("daemon: fetch trust bundle: %w", err)
	}
	tb, used, err := pki.VerifyTrustBundleAny(sb.GetBody(), offeredSignatures(sb), [][32]byte{pin})
	if err != nil {
		return nil, pki.TrustBundle{}, pki.JoinSignature{}, fmt.Errorf("daemon: trust bundle does not match the token's pin: %w", err)
	}
	return sb, tb, used, nil
}

// pinnedGatewayTLS is the client TLS configuration for a gateway pinned by
// its server roots and trust domain: the chain and the gateway SPIFFE ID
// are checked in VerifyPeerCertificate, which runs inside every handshake
// before the handshake completes, not a host name.
func pinnedGatewayTLS(roots *x509.CertPool, trustDomain string) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true, // replaced by VerifyPeerCertificate: pinned roots and SPIFFE ID, not a host name
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			return verifyGateway(raw, roots, trustDomain)
		},
	}
}

func sha256sum(b []byte) []byte {
	h := sha256.Sum256(b)
	return h[:]
}
