package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/gateway"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/internalv1"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// The internal channel: a gateway process holds no CA, signing or
// encryption key, so the node calls that need one (Bundle's signature,
// Join, Renew, Secret) are relayed to the api role over mutual TLS under
// the internal CA. The api presents spiffe://<td>/control and accepts only
// a client certificate with spiffe://<td>/gateway; the gateway accepts
// only the control identity. Answers go back to the node verbatim.

// statusOf turns a module error into the internal channel's status: the
// code only, never the detail.
func statusOf(err error) error {
	switch c := errs.CodeOf(err); c {
	case errs.AccessDenied:
		return status.Error(codes.PermissionDenied, string(c))
	case errs.Unauthenticated:
		return status.Error(codes.Unauthenticated, string(c))
	case errs.InvalidInput:
		return status.Error(codes.InvalidArgument, string(c))
	default:
		return status.Error(codes.Internal, string(errs.Internal))
	}
}

// errorOf turns an internal channel status back into a coded error.
func errorOf(err error) error {
	st, _ := status.FromError(err)
	switch st.Code() {
	case codes.PermissionDenied:
		return errs.New(errs.AccessDenied, "access denied")
	case codes.Unauthenticated:
		return errs.New(errs.Unauthenticated, "unauthenticated")
	case codes.InvalidArgument:
		return errs.New(errs.InvalidInput, "invalid input")
	default:
		return errs.Wrap(errs.Internal, "the internal channel failed", err)
	}
}

// controlServer answers the gateways' relayed calls with the in-process
// modules of a process that holds the keys.
type controlServer struct {
	internalv1.UnimplementedGatewayServicesServer
	svc gatewayServices
	// desired signs desired states for gateway-only processes (nil when
	// this process holds no worker key either).
	desired gateway.DesiredStates
	roots   *x509.CertPool
	td      string
	clk     clock.Clock
	log     *slog.Logger
}

// nodeIdentity verifies again the node chain a gateway forwarded (node CA,
// trust domain, expiry): a gateway can name only a node whose certificate
// it was shown.
func (c *controlServer) nodeIdentity(chain [][]byte) (pki.NodeIdentity, error) {
	var certs []*x509.Certificate
	for _, der := range chain {
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			return pki.NodeIdentity{}, errs.New(errs.Unauthenticated, "node certificate does not parse")
		}
		certs = append(certs, cert)
	}
	id, err := pki.VerifyNodeChain(certs, c.roots, c.td, c.clk.Now())
	if err != nil {
		return pki.NodeIdentity{}, errs.Wrap(errs.Unauthenticated, "node certificate does not verify", err)
	}
	return id, nil
}

func (c *controlServer) Bundle(ctx context.Context, _ *internalv1.BundleRequest) (*internalv1.BundleResponse, error) {
	b, err := c.svc.Bundle(ctx)
	if err != nil {
		return nil, statusOf(err)
	}
	raw, err := proto.Marshal(b)
	if err != nil {
		return nil, statusOf(err)
	}
	return &internalv1.BundleResponse{SignedBundle: raw}, nil
}

func (c *controlServer) Join(ctx context.Context, req *internalv1.JoinRequest) (*internalv1.JoinResponse, error) {
	nodeID, chain, err := c.svc.Join(ctx, req.GetToken(), req.GetCsrDer(), req.GetName())
	if err != nil {
		if errs.CodeOf(err) == errs.Internal {
			c.log.Error("relayed join failed", "err", err)
		}
		return nil, statusOf(err)
	}
	return &internalv1.JoinResponse{NodeId: nodeID, CertChainDer: chain}, nil
}

// Renew renews for the node whose forwarded chain verifies again, and only
// when the node's proof of possession (req.proof) verifies against that
// chain's leaf (gatewayServices.Renew): the chain alone is public, so
// without the proof a gateway could renew any node it has seen to a key of
// its own.
func (c *controlServer) Renew(ctx context.Context, req *internalv1.RenewRequest) (*internalv1.RenewResponse, error) {
	id, err := c.nodeIdentity(req.GetNodeChainDer())
	if err != nil {
		return nil, statusOf(err)
	}
	chain, err := c.svc.Renew(ctx, id, req.GetNodeChainDer(), req.GetCsrDer(), req.GetProof())
	if err != nil {
		if errs.CodeOf(err) == errs.Internal {
			c.log.Error("relayed renew failed", "err", err)
		}
		return nil, statusOf(err)
	}
	return &internalv1.RenewResponse{CertChainDer: chain}, nil
}

func (c *controlServer) Secret(ctx context.Context, req *internalv1.SecretRequest) (*internalv1.SecretResponse, error) {
	id, err := c.nodeIdentity(req.GetNodeChainDer())
	if err != nil {
		return nil, statusOf(err)
	}
	var sr nodev1.SecretRequest
	if err := proto.Unmarshal(req.GetRequest(), &sr); err != nil {
		return nil, status.Error(codes.InvalidArgument, string(errs.InvalidInput))
	}
	jwe, err := c.svc.Secret(ctx, id, req.GetNodeChainDer(), &sr)
	if err != nil {
		if errs.CodeOf(err) == errs.Internal {
			c.log.Error("relayed secret request failed", "node_id", id.NodeID, "err", err)
		}
		return nil, statusOf(err)
	}
	return &internalv1.SecretResponse{Jwe: jwe}, nil
}

// requireGateway refuses any call whose client certificate is not a
// gateway's (the TLS layer checked the chain to the internal CA already).
func requireGateway(td string, internalCAs []*x509.Certificate, clk clock.Clock) grpc.UnaryServerInterceptor {
	gateways := pki.NewInternalPeerVerifier(internalCAs, pki.GatewaySPIFFEID(td), x509.ExtKeyUsageClientAuth)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		p, ok := peer.FromContext(ctx)
		if !ok {
			return nil, status.Error(codes.Unauthenticated, string(errs.Unauthenticated))
		}
		ti, ok := p.AuthInfo.(credentials.TLSInfo)
		if !ok {
			return nil, status.Error(codes.Unauthenticated, string(errs.Unauthenticated))
		}
		var raw [][]byte
		for _, c := range ti.State.PeerCertificates {
			raw = append(raw, c.Raw)
		}
		if err := gateways.Verify(raw, clk.Now()); err != nil {
			return nil, status.Error(codes.Unauthenticated, string(errs.Unauthenticated))
		}
		return handler(ctx, req)
	}
}

// controlTLS is the api side of the internal channel: its control
// certificate as cert gives it on each handshake (so a reissued one takes
// effect at once), and a client certificate required and chained to the
// internal CAs (the interceptor checks the gateway identity).
func controlTLS(cert func() (*tls.Certificate, error), internalCAs []*x509.Certificate) *tls.Config {
	pool := x509.NewCertPool()
	for _, ca := range internalCAs {
		pool.AddCert(ca)
	}
	return &tls.Config{
		MinVersion:     tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert() },
		ClientAuth:     tls.RequireAndVerifyClientCert,
		ClientCAs:      pool,
	}
}

// relayServices is gateway.Services for a process without the keys: Bundle,
// Join, Renew and Secret go over the internal channel; refusals and the
// approver-set chain (database reads and writes, no key) stay local.
type relayServices struct {
	local  gatewayServices
	client internalv1.GatewayServicesClient
	clk    clock.Clock

	mu       sync.Mutex
	bundle   *nodev1.SignedTrustBundle
	bundleAt time.Time
}

// bundleTTL is how long a gateway keeps the signed trust bundle before it
// asks the api again (Bundle is an unauthenticated call; it must not make
// every caller reach the api).
const bundleTTL = time.Minute

// dialControl connects to the api's internal channel at addr with the
// gateway's certificate, accepting only the control identity under the
// internal CA.
func dialControl(addr string, cert tls.Certificate, b *pki.Bundle, clk clock.Clock) (*grpc.ClientConn, error) {
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{cert},
		// The identity check is the SPIFFE ID under the internal CA, not a
		// host name (VerifyPeerCertificate below does the chain too).
		InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			return pki.VerifyInternalPeer(raw, b.InternalRoots(), pki.ControlSPIFFEID(b.TrustDomain), x509.ExtKeyUsageServerAuth, clk.Now())
		},
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(nodev1.MaxMessageBytes), grpc.MaxCallSendMsgSize(nodev1.MaxMessageBytes)))
	if err != nil {
		return nil, fmt.Errorf("server: internal channel: %w", err)
	}
	return conn, nil
}

func (r *relayServices) Bundle(ctx context.Context) (*nodev1.SignedTrustBundle, error) {
	now := r.clk.Now()
	r.mu.Lock()
	if r.bundle != nil && now.Sub(r.bundleAt) < bundleTTL && !now.Before(r.bundleAt) {
		b := r.bundle
		r.mu.Unlock()
		return b, nil
	}
	r.mu.Unlock()
	resp, err := r.client.Bundle(ctx, &internalv1.BundleRequest{})
	if err != nil {
		return nil, errorOf(err)
	}
	var b nodev1.SignedTrustBundle
	if err := proto.Unmarshal(resp.GetSignedBundle(), &b); err != nil {
		return nil, errs.Wrap(errs.Internal, "the relayed trust bundle does not decode", err)
	}
	r.mu.Lock()
	r.bundle, r.bundleAt = &b, now
	r.mu.Unlock()
	return &b, nil
}

func (r *relayServices) Join(ctx context.Context, token string, csr []byte, name string) (string, [][]byte, error) {
	resp, err := r.client.Join(ctx, &internalv1.JoinRequest{Token: token, CsrDer: csr, Name: name})
	if err != nil {
		return "", nil, errorOf(err)
	}
	return resp.GetNodeId(), resp.GetCertChainDer(), nil
}

func (r *relayServices) Renew(ctx context.Context, _ pki.NodeIdentity, chain [][]byte, csr, proof []byte) ([][]byte, error) {
	resp, err := r.client.Renew(ctx, &internalv1.RenewRequest{NodeChainDer: chain, CsrDer: csr, Proof: proof})
	if err != nil {
		return nil, errorOf(err)
	}
	return resp.GetCertChainDer(), nil
}

func (r *relayServices) Secret(ctx context.Context, _ pki.NodeIdentity, chain [][]byte, req *nodev1.SecretRequest) (string, error) {
	raw, err := proto.Marshal(req)
	if err != nil {
		return "", errs.Wrap(errs.Internal, "encode secret request", err)
	}
	resp, err := r.client.Secret(ctx, &internalv1.SecretRequest{NodeChainDer: chain, Request: raw})
	if err != nil {
		return "", errorOf(err)
	}
	return resp.GetJwe(), nil
}

func (r *relayServices) Refused(ctx context.Context, typ, reason, nodeID string) {
	r.local.Refused(ctx, typ, reason, nodeID)
}

// HelperEvents records a node's helper events: a database write that
// needs no key, done locally like sandbox reports.
func (r *relayServices) HelperEvents(ctx context.Context, nodeID string, m *nodev1.HelperEvents) error {
	return r.local.HelperEvents(ctx, nodeID, m)
}

func (r *relayServices) ApproverSets(ctx context.Context) ([]*nodev1.SignedApproverSet, error) {
	return r.local.ApproverSets(ctx)
}

// TimeStatement reads the workers' latest signed time statement: a database
// read that needs no key, so a gateway-only process answers it locally.
func (r *relayServices) TimeStatement(ctx context.Context) (*nodev1.SignedTimeStatement, error) {
	return r.local.TimeStatement(ctx)
}

// SandboxReport records a node's sandbox report: a database write that
// needs no key (the node's certificate is in the database), so a
// gateway-only process does it locally, as it records command updates.
func (r *relayServices) SandboxReport(ctx context.Context, nodeID, serial string, rep *nodev1.SandboxReport) (string, error) {
	return r.local.SandboxReport(ctx, nodeID, serial, rep)
}
