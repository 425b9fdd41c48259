package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// refusedCall is one Services.Refused call.
type refusedCall struct{ typ, reason, nodeID string }

// authServices is the Services a gateway relays to, recording what
// reached it: an authenticated method's relay must never be reached by a
// refused caller.
type authServices struct {
	mu      sync.Mutex
	refused []refusedCall
	relayed []string
}

func (s *authServices) relay(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.relayed = append(s.relayed, name)
}

func (s *authServices) Bundle(context.Context) (*nodev1.SignedTrustBundle, error) {
	s.relay("Bundle")
	return &nodev1.SignedTrustBundle{}, nil
}
func (s *authServices) Join(context.Context, string, []byte, string) (string, [][]byte, error) {
	s.relay("Join")
	return "n-1", nil, nil
}
func (s *authServices) Renew(context.Context, pki.NodeIdentity, [][]byte, []byte, []byte) ([][]byte, error) {
	s.relay("Renew")
	return nil, nil
}
func (s *authServices) Secret(context.Context, pki.NodeIdentity, [][]byte, *nodev1.SecretRequest) (string, error) {
	s.relay("Secret")
	return "", nil
}
func (s *authServices) Refused(_ context.Context, typ, reason, nodeID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refused = append(s.refused, refusedCall{typ, reason, nodeID})
}
func (s *authServices) ApproverSets(context.Context) ([]*nodev1.SignedApproverSet, error) {
	s.relay("ApproverSets")
	return nil, nil
}
func (s *authServices) TimeStatement(context.Context) (*nodev1.SignedTimeStatement, error) {
	return nil, nil
}
func (s *authServices) SandboxReport(context.Context, string, string, *nodev1.SandboxReport) (string, error) {
	s.relay("SandboxReport")
	return "", nil
}

func (s *authServices) HelperEvents(context.Context, string, *nodev1.HelperEvents) error {
	s.relay("HelperEvents")
	return nil
}

// authRegistry knows certificates by serial and records the sessions
// opened and closed.
type authRegistry struct {
	certs  map[string]CertInfo
	mu     sync.Mutex
	opened []HelloInfo
	closed []string // session ids
	// beforeClose, when set, runs as CloseSession starts.
	beforeClose func()
}

func (r *authRegistry) CertInfo(_ context.Context, serial string) (CertInfo, error) {
	ci, ok := r.certs[serial]
	if !ok {
		return CertInfo{}, errors.New("unknown")
	}
	return ci, nil
}
func (r *authRegistry) OpenSession(_ context.Context, h HelloInfo) (SessionResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.opened = append(r.opened, h)
	return SessionResult{}, nil
}
func (r *authRegistry) CloseSession(_ context.Context, _, sessionID string) error {
	if r.beforeClose != nil {
		r.beforeClose()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = append(r.closed, sessionID)
	return nil
}
func (*authRegistry) CloseGatewaySessions(context.Context, string) error { return nil }
func (*authRegistry) RevokedSince(_ context.Context, since time.Time) ([]string, time.Time, error) {
	return nil, since, nil
}
func (*authRegistry) SupersededCertificateUsed(context.Context, string, string) (bool, error) {
	return false, nil
}
func (*authRegistry) Heartbeat(context.Context, string) error { return nil }
func (*authRegistry) SessionsMovedSince(_ context.Context, _ string, since time.Time) (map[string]string, time.Time, error) {
	return nil, since, nil
}

// wantRefusal is the exact answer each authenticated method gives a caller
// without a valid certificate, and the event the refusal is recorded as. A
// method added to the service must be added here (or to PublicMethods):
// the test fails until it is.
var wantRefusal = map[string]struct {
	code  codes.Code
	event string
}{
	nodev1.Gateway_Renew_FullMethodName:   {codes.PermissionDenied, "security.renew.refused"},
	nodev1.Gateway_Secret_FullMethodName:  {codes.PermissionDenied, "security.secret.refused"},
	nodev1.Gateway_Session_FullMethodName: {codes.Unauthenticated, "security.session.refused"},
	nodev1.Gateway_Tunnel_FullMethodName:  {codes.PermissionDenied, "security.tunnel.refused"},
	nodev1.Gateway_Bastion_FullMethodName: {codes.Unauthenticated, "security.bastion.refused"},
}

// authFixture is a gateway served over TLS on loopback, with a node CA,
// a node certificate the registry knows and one it holds revoked.
type authFixture struct {
	addr    string
	g       *Gateway
	reg     *authRegistry
	queue   *fakeQueue
	svc     *authServices
	good    tls.Certificate // known, valid
	bastion tls.Certificate // known, valid, role bastion
	revoked tls.Certificate // known, revoked
	foreign tls.Certificate // from another node CA
}

func nodeCert(t *testing.T, b *pki.Bundle, kek pki.KEK, nodeID string, now time.Time) (tls.Certificate, string) {
	t.Helper()
	return roleCert(t, b, kek, nodeID, pki.RoleNode, now)
}

func roleCert(t *testing.T, b *pki.Bundle, kek pki.KEK, nodeID, role string, now time.Time) (tls.Certificate, string) {
	t.Helper()
	caKey, err := b.NodeCAKey(kek)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := pki.NewNodeKey()
	csr, _ := pki.CSR(key, nodeID)
	der, err := pki.IssueNodeCert(b.NodeCA, caKey, csr, b.TrustDomain, nodeID, role, time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pki.SerialHex(leaf)
}

func newAuthFixture(t *testing.T) *authFixture {
	t.Helper()
	now := time.Now()
	kek := pki.KEK{1}
	const td = "dev.bc.local"
	b, err := pki.Init(t.TempDir(), td, kek, clock.NewFake(now.Add(-time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.Init(t.TempDir(), td, kek, clock.NewFake(now.Add(-time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	caKey, _ := b.NodeCAKey(kek)
	server, err := pki.IssueServerCert(b.NodeCA, caKey, td, []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	f := &authFixture{svc: &authServices{}, queue: newFakeQueue()}
	var goodSerial, revokedSerial string
	f.good, goodSerial = nodeCert(t, b, kek, "n-good", now)
	f.revoked, revokedSerial = nodeCert(t, b, kek, "n-revoked", now)
	f.foreign, _ = nodeCert(t, other, kek, "n-good", now)
	var bastionSerial string
	f.bastion, bastionSerial = roleCert(t, b, kek, "n-bastion", pki.RoleBastion, now)
	roots := x509.NewCertPool()
	roots.AddCert(b.NodeCA)
	f.reg = &authRegistry{certs: map[string]CertInfo{
		goodSerial:    {NodeID: "n-good", Role: pki.RoleNode, AllowedKinds: []string{"run"}},
		revokedSerial: {NodeID: "n-revoked", Role: pki.RoleNode, Revoked: true, RevokeReason: "operator"},
		bastionSerial: {NodeID: "n-bastion", Role: pki.RoleBastion},
	}}
	g, err := New(Config{TrustDomain: td, NodeRoots: roots, ServerCert: server, Log: slog.New(slog.DiscardHandler)},
		f.svc, f.reg, f.queue, bus.New())
	if err != nil {
		t.Fatal(err)
	}
	f.g = g
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := g.GRPCServer()
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	f.addr = lis.Addr().String()
	return f
}

// dial connects with cert as the client certificate (none when nil).
func (f *authFixture) dial(t *testing.T, cert *tls.Certificate) *grpc.ClientConn {
	t.Helper()
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true} // test: the server is ours
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// call invokes method on conn (a unary call or a stream's first receive)
// with an empty message and returns the error.
func call(ctx context.Context, conn *grpc.ClientConn, method string, stream *grpc.StreamDesc) error {
	if stream == nil {
		return conn.Invoke(ctx, method, &emptypb.Empty{}, &emptypb.Empty{})
	}
	cs, err := conn.NewStream(ctx, stream, method)
	if err != nil {
		return err
	}
	_ = cs.SendMsg(&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Hello{Hello: &nodev1.Hello{NodeId: "n-good", BootId: "b"}}})
	err = cs.RecvMsg(&emptypb.Empty{})
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// TestEveryMethodAuthenticated lists every method and stream of the node
// service and checks that each one outside PublicMethods is refused, with
// its exact code and recorded refusal, to a caller with no client
// certificate, one from another node CA, and one the registry holds
// revoked; and that the refused call never reached a relayed service.
func TestEveryMethodAuthenticated(t *testing.T) {
	f := newAuthFixture(t)
	type method struct {
		name   string
		stream *grpc.StreamDesc
	}
	var methods []method
	for _, m := range nodev1.Gateway_ServiceDesc.Methods {
		methods = append(methods, method{"/" + nodev1.Gateway_ServiceDesc.ServiceName + "/" + m.MethodName, nil})
	}
	for i, s := range nodev1.Gateway_ServiceDesc.Streams {
		methods = append(methods, method{"/" + nodev1.Gateway_ServiceDesc.ServiceName + "/" + s.StreamName, &nodev1.Gateway_ServiceDesc.Streams[i]})
	}
	callers := map[string]struct {
		cert   *tls.Certificate
		reason string
	}{
		"no certificate":      {nil, "no-client-certificate"},
		"another node CA":     {&f.foreign, "certificate-invalid"},
		"revoked certificate": {&f.revoked, "certificate-revoked"},
	}
	authenticated := 0
	for _, m := range methods {
		if PublicMethods[m.name] {
			continue
		}
		authenticated++
		want, ok := wantRefusal[m.name]
		if !ok {
			t.Errorf("%s: not in PublicMethods and no expected refusal: add it to wantRefusal", m.name)
			continue
		}
		for name, c := range callers {
			t.Run(m.name+"/"+name, func(t *testing.T) {
				f.svc.mu.Lock()
				f.svc.refused, f.svc.relayed = nil, nil
				f.svc.mu.Unlock()
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				err := call(ctx, f.dial(t, c.cert), m.name, m.stream)
				if got := status.Code(err); got != want.code {
					t.Fatalf("code %v (%v), want %v", got, err, want.code)
				}
				f.svc.mu.Lock()
				defer f.svc.mu.Unlock()
				if len(f.svc.refused) != 1 || f.svc.refused[0].typ != want.event || f.svc.refused[0].reason != c.reason {
					t.Fatalf("refusals recorded %+v, want one %s %s", f.svc.refused, want.event, c.reason)
				}
				if len(f.svc.relayed) != 0 {
					t.Fatalf("a refused call reached %v", f.svc.relayed)
				}
				f.reg.mu.Lock()
				defer f.reg.mu.Unlock()
				if len(f.reg.opened) != 0 {
					t.Fatalf("a refused call opened a session: %+v", f.reg.opened)
				}
			})
		}
	}
	if authenticated != len(wantRefusal) {
		t.Errorf("%d authenticated methods served, %d expected", authenticated, len(wantRefusal))
	}
	// The allowlist is exactly Bundle and Join.
	if len(PublicMethods) != 2 || !PublicMethods[nodev1.Gateway_Bundle_FullMethodName] || !PublicMethods[nodev1.Gateway_Join_FullMethodName] {
		t.Errorf("PublicMethods = %v, want Bundle and Join only", PublicMethods)
	}
}

// TestPublicMethodsNeedNoCertificate: Bundle and Join are served to a
// caller without a client certificate.
func TestPublicMethodsNeedNoCertificate(t *testing.T) {
	f := newAuthFixture(t)
	conn := f.dial(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := nodev1.NewGatewayClient(conn).Bundle(ctx, &nodev1.BundleRequest{}); err != nil {
		t.Fatalf("Bundle: %v", err)
	}
	if _, err := nodev1.NewGatewayClient(conn).Join(ctx, &nodev1.JoinRequest{}); err != nil {
		t.Fatalf("Join: %v", err)
	}
}

// TestValidCertificatePassesInterceptor: a known, unrevoked certificate
// reaches the handler (Renew is relayed).
func TestValidCertificatePassesInterceptor(t *testing.T) {
	f := newAuthFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := nodev1.NewGatewayClient(f.dial(t, &f.good)).Renew(ctx, &nodev1.RenewRequest{})
	if err != nil {
		t.Fatalf("Renew: %v", err)
	}
	f.svc.mu.Lock()
	defer f.svc.mu.Unlock()
	if len(f.svc.relayed) == 0 || f.svc.relayed[0] != "Renew" || len(f.svc.refused) != 0 {
		t.Fatalf("relayed %v, refused %v", f.svc.relayed, f.svc.refused)
	}
}

// TestHandlersRefuseWithoutInterceptor: a handler reached without the
// interceptors (no authenticated caller on its context) refuses with the
// method's code instead of serving.
func TestHandlersRefuseWithoutInterceptor(t *testing.T) {
	svc := &authServices{}
	g := &Gateway{svc: svc}
	if _, err := g.Renew(context.Background(), &nodev1.RenewRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Renew: %v", err)
	}
	if _, err := g.Secret(context.Background(), &nodev1.SecretRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Secret: %v", err)
	}
	if len(svc.relayed) != 0 {
		t.Errorf("relayed %v", svc.relayed)
	}
}

// TestSessionDeliversAndAcks: an authenticated node's Hello opens a
// session in the registry; before any command is handed over, those of a
// kind its certificate does not allow are cancelled; the Welcome carries
// the allowed kinds; the queued command is delivered and recorded as sent;
// the node's update is applied and acknowledged; when the node leaves,
// its session is closed in the registry.
func TestSessionDeliversAndAcks(t *testing.T) {
	f := newAuthFixture(t)
	f.queue.add("n-good", "c-run", "run")
	f.queue.add("n-good", "c-reboot", "reboot")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go f.g.Run(ctx)
	stream, err := nodev1.NewGatewayClient(f.dial(t, &f.good)).Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Hello{Hello: &nodev1.Hello{NodeId: "n-good", BootId: "boot-1"}}}); err != nil {
		t.Fatal(err)
	}
	m, err := stream.Recv()
	if err != nil || m.GetWelcome() == nil || len(m.GetWelcome().AllowedKinds) != 1 || m.GetWelcome().AllowedKinds[0] != "run" {
		t.Fatalf("welcome: %v %v", m, err)
	}
	sessionID := m.GetWelcome().SessionId
	if m, err = stream.Recv(); err != nil || m.GetCommand().GetId() != "c-run" {
		t.Fatalf("command: %v %v", m, err)
	}
	if f.queue.state("c-reboot") != wire.StateCancelled {
		t.Fatalf("disallowed kind is %s", f.queue.state("c-reboot"))
	}
	if err := stream.Send(&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Update{Update: &nodev1.CommandUpdate{Body: []byte("c-run")}}}); err != nil {
		t.Fatal(err)
	}
	if m, err = stream.Recv(); err != nil || m.GetAck().GetCommandId() != "c-run" || m.GetAck().GetState() != string(wire.StateSucceeded) {
		t.Fatalf("ack: %v %v", m, err)
	}
	if !f.g.Connected("n-good") || f.g.SessionCount() != 1 {
		t.Fatal("session not held")
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		f.reg.mu.Lock()
		closed := len(f.reg.closed) == 1 && f.reg.closed[0] == sessionID
		f.reg.mu.Unlock()
		if closed && !f.g.Connected("n-good") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("session not closed in the registry")
		}
	}
	f.reg.mu.Lock()
	defer f.reg.mu.Unlock()
	if len(f.reg.opened) != 1 || f.reg.opened[0].BootID != BootTag("boot-1") || f.reg.opened[0].SessionID != sessionID {
		t.Fatalf("opened %+v", f.reg.opened)
	}
}

// The Bastion stream is a bastion certificate's alone, and a bastion
// certificate may call nothing but Renew and Bastion: a node's valid
// certificate is refused the Bastion stream, and a bastion's valid
// certificate is refused Session, Secret and Tunnel, each with
// ACCESS_DENIED recorded as role-not-allowed and nothing relayed.
func TestRoleGatesTheBastionStream(t *testing.T) {
	f := newAuthFixture(t)
	streams := map[string]*grpc.StreamDesc{}
	for i, s := range nodev1.Gateway_ServiceDesc.Streams {
		streams["/"+nodev1.Gateway_ServiceDesc.ServiceName+"/"+s.StreamName] = &nodev1.Gateway_ServiceDesc.Streams[i]
	}
	for _, c := range []struct {
		name   string
		cert   tls.Certificate
		method string
	}{
		{"node calls Bastion", f.good, nodev1.Gateway_Bastion_FullMethodName},
		{"bastion calls Session", f.bastion, nodev1.Gateway_Session_FullMethodName},
		{"bastion calls Secret", f.bastion, nodev1.Gateway_Secret_FullMethodName},
		{"bastion calls Tunnel", f.bastion, nodev1.Gateway_Tunnel_FullMethodName},
	} {
		t.Run(c.name, func(t *testing.T) {
			f.svc.mu.Lock()
			f.svc.refused, f.svc.relayed = nil, nil
			f.svc.mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := call(ctx, f.dial(t, &c.cert), c.method, streams[c.method])
			if status.Code(err) != codes.PermissionDenied {
				t.Fatalf("code %v (%v), want PermissionDenied", status.Code(err), err)
			}
			f.svc.mu.Lock()
			defer f.svc.mu.Unlock()
			if len(f.svc.refused) != 1 || f.svc.refused[0].reason != "role-not-allowed" || len(f.svc.relayed) != 0 {
				t.Fatalf("refusals %+v relayed %v, want one role-not-allowed and nothing relayed", f.svc.refused, f.svc.relayed)
			}
		})
	}
}
