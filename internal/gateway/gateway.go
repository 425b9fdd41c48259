// Package gateway is the node-facing gRPC endpoint over mutual TLS 1.3.
//
// It authenticates each node by its client certificate (node CA chain,
// trust domain, role, expiry, and revocation from the registry), relays
// Bundle, Join, Renew and Secret to services it holds no key for (in a
// gateway-only process, over the internal channel to the api), holds each
// node's session (known to every gateway through the registry), sends
// commands exactly as the database holds them (signed by a worker, which
// the gateway cannot do: it imports no signing key and no SQL driver), and
// stores the node's signed updates. A revoked certificate's session is
// closed within one revocation poll (1 s by default) on every gateway.
package gateway

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/tickets"
)

// CertInfo is the registry's record of a node certificate.
type CertInfo struct {
	NodeID       string
	Role         string
	Revoked      bool
	RevokeReason string   // why, when revoked ("superseded" after a renewal)
	AllowedKinds []string // nil: no narrowing
}

// HelloInfo is a Hello joined with what the certificate proved.
type HelloInfo struct {
	NodeID, BootID, Serial, SessionID, GatewayID, Version string
	Labels                                                map[string]string
	Inventory                                             []byte // JSON
}

// SessionResult is the registry's verdict on a Hello.
type SessionResult struct {
	Quarantined bool
}

// Registry is the node registry the gateway reads and writes sessions in.
type Registry interface {
	CertInfo(ctx context.Context, serial string) (CertInfo, error)
	OpenSession(ctx context.Context, h HelloInfo) (SessionResult, error)
	CloseSession(ctx context.Context, nodeID, sessionID string) error
	CloseGatewaySessions(ctx context.Context, gatewayID string) error
	RevokedSince(ctx context.Context, since time.Time) ([]string, time.Time, error)
	// SupersededCertificateUsed records a call made with a certificate a
	// renewal superseded (a copy of the node's identity) as a flip of the
	// node, and reports whether that quarantined it.
	SupersededCertificateUsed(ctx context.Context, nodeID, serial string) (bool, error)
	// Heartbeat refreshes the heartbeat of this gateway's open sessions.
	Heartbeat(ctx context.Context, gatewayID string) error
	// SessionsMovedSince returns node id -> current session id for the
	// sessions opened at or after since on other gateways.
	SessionsMovedSince(ctx context.Context, gatewayID string, since time.Time) (map[string]string, time.Time, error)
}

// Commands is the command queue as the gateway sees it.
type Commands interface {
	// PendingFor returns the signed, queued commands of nodeIDs, at most
	// perNode of each node's oldest.
	PendingFor(ctx context.Context, nodeIDs []string, perNode int) (map[string][]*nodev1.SignedCommand, error)
	// MarkSent records that the commands were sent, each on its session.
	MarkSent(ctx context.Context, sent []wire.Sent) error
	// RequeueEnded puts the commands still sent on the ended sessions
	// (nothing reported on them by the node) back in the queue.
	RequeueEnded(ctx context.Context, sessionIDs []string) (int64, error)
	// RequeueNode puts nodeID's commands still sent on a session other
	// than its current one, sessionID, back in the queue.
	RequeueNode(ctx context.Context, nodeID, sessionID string) (int64, error)
	ApplyUpdates(ctx context.Context, items []wire.UpdateItem) []wire.UpdateResult
	CancelDisallowed(ctx context.Context, nodeID, role string, allowed []string) (int, error)
	PendingNodes(ctx context.Context) ([]string, error)
}

// Services are the services the gateway relays to: Bundle, Join, Renew
// and Secret need keys the gateway does not hold, so a gateway-only
// process reaches them over the internal channel (server.relayServices);
// chain is the client certificate chain the node presented, leaf first, so
// that the holder of the keys can verify it again.
type Services interface {
	Bundle(ctx context.Context) (*nodev1.SignedTrustBundle, error)
	Join(ctx context.Context, token string, csrDER []byte, name string) (nodeID string, chain [][]byte, err error)
	// Renew certifies csrDER's key for the node, only if proof (the
	// node's signature with its current key, nodev1.RenewRequest.proof)
	// verifies against chain's leaf.
	Renew(ctx context.Context, id pki.NodeIdentity, chain [][]byte, csrDER, proof []byte) ([][]byte, error)
	// Secret relays a node's secret request to the broker.
	Secret(ctx context.Context, id pki.NodeIdentity, chain [][]byte, req *nodev1.SecretRequest) (string, error)
	// Refused records a refusal the gateway decided itself (a Renew or
	// Session whose certificate failed), rate limited per reason.
	Refused(ctx context.Context, typ, reason, nodeID string)
	// ApproverSets returns the chain of signed approver-set changes, oldest
	// first; the gateway relays it verbatim and each node checks it.
	ApproverSets(ctx context.Context) ([]*nodev1.SignedApproverSet, error)
	// TimeStatement returns the latest time statement a worker signed (nil
	// when there is none yet); the gateway relays it verbatim in Welcome.
	TimeStatement(ctx context.Context) (*nodev1.SignedTimeStatement, error)
	// SandboxReport relays a node's signed sandbox report, received on the
	// session nodeID opened with the certificate serial, to the sandboxes
	// module, which alone decides what it changes. It returns the
	// sandbox's id when the report was recorded (or the sandbox is already
	// final), and the node gets an ack; an error leaves it unacknowledged.
	SandboxReport(ctx context.Context, nodeID, serial string, r *nodev1.SandboxReport) (sandboxID string, err error)
	// HelperEvents records the node's root-helper events as audit rows
	// (nodes.Service.RecordHelperEvents); nil error means recorded, and
	// the node gets an ack.
	HelperEvents(ctx context.Context, nodeID string, m *nodev1.HelperEvents) error
}

// Poker delivers pokes (the in-process bus implements it).
type Poker interface {
	Subscribe(topic string) (<-chan struct{}, func())
}

// Config configures a gateway. NodeRoots and TrustDomain are required:
// there is no weaker default.
type Config struct {
	TrustDomain string
	NodeRoots   *x509.CertPool
	ServerCert  tls.Certificate
	// GetServerCert, when set, gives the certificate for each handshake
	// instead of ServerCert, so that a certificate the process reissues
	// takes effect without a restart.
	GetServerCert  func() (*tls.Certificate, error)
	GatewayID      string
	Clock          clock.Clock
	Log            *slog.Logger
	RevocationPoll time.Duration // default 1s; also how often sessions moved to another gateway are looked for
	// Heartbeat is how often the gateway refreshes its sessions' heartbeat
	// in the registry (default 10s, nodes.SessionHeartbeat); a session not
	// refreshed within the registry's window went quiet.
	Heartbeat   time.Duration
	CommandPoll time.Duration // default 250ms: one dispatch round (nodes with work, then their commands) per interval for the whole gateway
	// Tickets verifies tunnel tickets again (the command-signing roots
	// and trust domain), and Spent records their jtis across gateways
	// (tickets/spentdb). Without both, OpenTunnel refuses every tunnel.
	Tickets *tickets.Verifier
	Spent   tickets.Spent
	// Feed is the revocation feed the gateway follows (revfeed.go): it
	// closes the sessions of revoked node certificates and relays each
	// node's own entries to it. Nil: not followed (sessions of revoked
	// certificates still close by RevokedSince).
	Feed RevocationFeed
	// Bastions serves bastions' streams (bastion.go); nil: none is served.
	Bastions BastionServices
	// DesiredStates signs each node's desired state (desired.go), sent
	// right after Welcome on every session. Nil: none is sent (a
	// gateway-only process holds no key to sign with).
	DesiredStates DesiredStates
}

// Gateway serves the Gateway gRPC service.
type Gateway struct {
	nodev1.UnimplementedGatewayServer
	cfg  Config
	reg  Registry
	cmds Commands
	svc  Services
	poke Poker

	// mu guards sessions.
	mu       sync.Mutex
	sessions map[string]*session       // by node id
	tunnels  map[string]*pendingTunnel // TunnelOpens sent, by tunnel id

	disp    *dispatcher         // command delivery to the sessions
	updates chan *pendingUpdate // to the update batcher

	// sessionLoops are the goroutines of the sessions (receive, deliver);
	// Run waits for them, so none is left in a query once it returns.
	sessionLoops sync.WaitGroup
}

// ErrInvalidConfig is wrapped by New for a gateway without node-CA roots or
// a trust domain.
var ErrInvalidConfig = errs.New(errs.InvalidConfig, "gateway needs node-CA roots and a trust domain")

// New checks cfg and returns a gateway. It refuses (INVALID_CONFIG) to be
// built without node-CA roots, a trust domain or a server certificate.
func New(cfg Config, svc Services, reg Registry, cmds Commands, poke Poker) (*Gateway, error) {
	if cfg.NodeRoots == nil || cfg.TrustDomain == "" || len(cfg.ServerCert.Certificate) == 0 && cfg.GetServerCert == nil {
		return nil, ErrInvalidConfig
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.GatewayID == "" {
		cfg.GatewayID = ids.New("gw")
	}
	if cfg.RevocationPoll == 0 {
		cfg.RevocationPoll = time.Second
	}
	if cfg.CommandPoll == 0 {
		cfg.CommandPoll = 250 * time.Millisecond
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = 10 * time.Second
	}
	return &Gateway{cfg: cfg, reg: reg, cmds: cmds, svc: svc, poke: poke, sessions: map[string]*session{}, tunnels: map[string]*pendingTunnel{},
		disp: newDispatcher(cmds, cfg.Log), updates: make(chan *pendingUpdate, maxUpdateBatch)}, nil
}

// TLSConfig is the server side: TLS 1.3 only; a client certificate is
// requested but checked per call, since Join and Bundle accept none.
func (g *Gateway) TLSConfig() *tls.Config {
	c := &tls.Config{
		MinVersion: tls.VersionTLS13,
		ClientAuth: tls.RequestClientCert,
	}
	if get := g.cfg.GetServerCert; get != nil {
		c.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return get() }
	} else {
		c.Certificates = []tls.Certificate{g.cfg.ServerCert}
	}
	return c
}

// GRPCServer returns a gRPC server with the gateway registered on TLS,
// behind the authenticating interceptors (see PublicMethods).
func (g *Gateway) GRPCServer() *grpc.Server {
	s := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(g.TLSConfig())),
		grpc.MaxRecvMsgSize(nodev1.MaxMessageBytes),
		grpc.MaxSendMsgSize(nodev1.MaxMessageBytes),
		// No read buffer of gRPC's own: TLS already buffers what it
		// decrypted, and gRPC's 32 KiB a connection was half of a
		// session's heap (docs/performance.md, "Sessions and memory").
		grpc.ReadBufferSize(0),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		// Every method but PublicMethods is authenticated before its
		// handler runs, so a new method cannot forget to.
		grpc.ChainUnaryInterceptor(g.unaryAuth),
		grpc.ChainStreamInterceptor(g.streamAuth),
		// Stop returns only once every handler has, so a session's close
		// is written before the process closes its database.
		grpc.WaitForHandlers(true),
	)
	nodev1.RegisterGatewayServer(s, g)
	return s
}

// CloseStale marks closed the sessions an earlier run of this gateway (same
// GatewayID) left open in the registry. It must return before the gateway
// serves: run concurrently, it could close a session a node has just
// opened here, and that node would look disconnected (no placement, no
// tunnel) while its session is up.
func (g *Gateway) CloseStale(ctx context.Context) error {
	if err := g.reg.CloseGatewaySessions(ctx, g.cfg.GatewayID); err != nil {
		return fmt.Errorf("gateway: close stale sessions: %w", err)
	}
	return nil
}

// Run closes sessions of revoked or expired certificates, and sessions
// whose node opened a newer session on another gateway, until ctx ends; it
// keeps this gateway's sessions' heartbeat fresh in the registry. Call
// CloseStale before serving.
func (g *Gateway) Run(ctx context.Context) {
	// Run returns only when its helpers and the sessions' goroutines
	// have (the caller ends ctx after the gRPC server stopped): one still
	// in a query after the control plane closed its database would use it
	// after Close (a SQLite reader reopening the files being removed).
	var wg sync.WaitGroup
	defer g.sessionLoops.Wait()
	defer wg.Wait()
	for _, loop := range []func(context.Context){g.dispatch, g.batchUpdates, g.heartbeat, g.followFeed} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			loop(ctx)
		}()
	}
	poke, stop := g.poke.Subscribe(bus.TopicRevoked)
	defer stop()
	remote, stopRemote := g.poke.Subscribe(bus.RemoteTopic(bus.TopicRevoked))
	defer stopRemote()
	moved, stopMoved := g.poke.Subscribe(bus.TopicSessions)
	defer stopMoved()
	movedRemote, stopMovedRemote := g.poke.Subscribe(bus.RemoteTopic(bus.TopicSessions))
	defer stopMovedRemote()
	t := time.NewTicker(g.cfg.RevocationPoll)
	defer t.Stop()
	since := g.cfg.Clock.Now().Add(-time.Minute)
	movedSince := since
	for {
		select {
		case <-ctx.Done():
			return
		case <-poke:
		case <-remote:
		case <-moved:
		case <-movedRemote:
		case <-t.C:
		}
		if next, err := g.closeRevoked(ctx, since); err != nil {
			g.cfg.Log.Error("read revocations", "err", err)
		} else {
			// Ask again from a little before the newest seen, so a
			// revocation committed with an older timestamp is not missed.
			since = next.Add(-5 * time.Second)
		}
		if next, err := g.closeMoved(ctx, movedSince); err != nil {
			g.cfg.Log.Error("read moved sessions", "err", err)
		} else {
			movedSince = next.Add(-5 * time.Second)
		}
	}
}

// closeRevoked closes the sessions of certificates revoked since.
func (g *Gateway) closeRevoked(ctx context.Context, since time.Time) (time.Time, error) {
	serials, next, err := g.reg.RevokedSince(ctx, since)
	if err != nil {
		return since, err
	}
	revoked := map[string]bool{}
	for _, s := range serials {
		revoked[s] = true
	}
	g.mu.Lock()
	var closing []*session
	for _, s := range g.sessions {
		if revoked[s.serial] {
			closing = append(closing, s)
		}
	}
	g.mu.Unlock()
	for _, s := range closing {
		s.cancel(g.revocationCause(ctx, s.serial))
	}
	return next, nil
}

// revocationCause is why a revoked certificate's session closes: a
// certificate a renewal superseded closes like an ended session (the node
// reconnects, and a copy of its identity still holding the old one is
// counted), any other revocation as revoked, which bcd stops on.
//
// When the reason cannot be read, the session closes as superseded: the
// node reconnects and the handshake's own check refuses it as revoked if
// it is, whereas a wrong "revoked" would stop bcd for good.
func (g *Gateway) revocationCause(ctx context.Context, serial string) error {
	ci, err := g.reg.CertInfo(ctx, serial)
	if err != nil {
		g.cfg.Log.Error("read revoked certificate", "serial", serial, "err", err)
		return errCertSuperseded
	}
	if ci.RevokeReason == reasonSuperseded {
		return errCertSuperseded
	}
	return errRevoked
}

// closeMoved closes the sessions of nodes whose current session, opened
// since, is on another gateway. Only sessions that were in the map before
// the read are judged: their registry rows were written before it, so a
// different current session there is newer than ours.
func (g *Gateway) closeMoved(ctx context.Context, since time.Time) (time.Time, error) {
	g.mu.Lock()
	before := make(map[string]*session, len(g.sessions))
	for id, s := range g.sessions {
		before[id] = s
	}
	g.mu.Unlock()
	current, next, err := g.reg.SessionsMovedSince(ctx, g.cfg.GatewayID, since)
	if err != nil {
		return since, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for nodeID, sessionID := range current {
		s := before[nodeID]
		if s != nil && s.id != sessionID && g.sessions[nodeID] == s {
			g.cfg.Log.Info("session moved to another gateway", "node_id", nodeID, "session_id", s.id)
			s.cancel(errSuperseded)
		}
	}
	return next, nil
}

// dispatch runs the dispatcher, woken by every batch signed in this
// process or another (PostgreSQL NOTIFY), until ctx ends.
func (g *Gateway) dispatch(ctx context.Context) {
	local, stopLocal := g.poke.Subscribe(bus.TopicSigned)
	defer stopLocal()
	remote, stopRemote := g.poke.Subscribe(bus.RemoteTopic(bus.TopicSigned))
	defer stopRemote()
	g.disp.run(ctx, g.cfg.CommandPoll, local, remote)
}

// heartbeat refreshes this gateway's sessions in the registry every
// Heartbeat, so that other gateways can tell a live session from one whose
// gateway went away.
func (g *Gateway) heartbeat(ctx context.Context) {
	t := time.NewTicker(g.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := g.reg.Heartbeat(ctx, g.cfg.GatewayID); err != nil && ctx.Err() == nil {
			g.cfg.Log.Error("session heartbeat", "err", err)
		}
	}
}

// Connected reports whether nodeID has a live session on this gateway.
func (g *Gateway) Connected(nodeID string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, ok := g.sessions[nodeID]
	return ok
}

// SessionCount returns the number of live sessions on this gateway.
func (g *Gateway) SessionCount() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.sessions)
}

func toStatus(err error) error {
	switch errs.CodeOf(err) {
	case errs.AccessDenied:
		return status.Error(codes.PermissionDenied, string(errs.AccessDenied))
	case errs.Unauthenticated:
		return status.Error(codes.Unauthenticated, string(errs.Unauthenticated))
	case errs.InvalidInput:
		return status.Error(codes.InvalidArgument, string(errs.InvalidInput))
	default:
		return status.Error(codes.Internal, string(errs.Internal))
	}
}

// Bundle returns the join-key-signed trust bundle (no client cert needed).
func (g *Gateway) Bundle(ctx context.Context, _ *nodev1.BundleRequest) (*nodev1.SignedTrustBundle, error) {
	b, err := g.svc.Bundle(ctx)
	if err != nil {
		g.cfg.Log.Error("read trust bundle", "err", err)
		return nil, status.Error(codes.Unavailable, string(errs.Internal))
	}
	return b, nil
}

// Join relays a join to the identity services; it is the only call that
// takes no client certificate besides Bundle.
func (g *Gateway) Join(ctx context.Context, req *nodev1.JoinRequest) (*nodev1.JoinResponse, error) {
	nodeID, chain, err := g.svc.Join(ctx, req.GetToken(), req.GetCsrDer(), req.GetName())
	if err != nil {
		if errs.CodeOf(err) == errs.Internal {
			g.cfg.Log.Error("join failed", "err", err)
		}
		return nil, toStatus(err)
	}
	b, err := g.svc.Bundle(ctx)
	if err != nil {
		g.cfg.Log.Error("read trust bundle", "err", err)
		return nil, status.Error(codes.Internal, string(errs.Internal))
	}
	return &nodev1.JoinResponse{NodeId: nodeID, CertChainDer: chain, Bundle: b}, nil
}

// Renew needs mutual TLS with the node's current, unrevoked certificate
// and the node's proof of possession of that certificate's key, which the
// services verify.
func (g *Gateway) Renew(ctx context.Context, req *nodev1.RenewRequest) (*nodev1.RenewResponse, error) {
	c, err := mustCaller(ctx, nodev1.Gateway_Renew_FullMethodName)
	if err != nil {
		return nil, err
	}
	chain, err := g.svc.Renew(ctx, c.id, peerChain(ctx), req.GetCsrDer(), req.GetProof())
	if err != nil {
		if errs.CodeOf(err) == errs.Internal {
			g.cfg.Log.Error("renew failed", "err", err)
		}
		return nil, toStatus(err)
	}
	b, err := g.svc.Bundle(ctx)
	if err != nil {
		g.cfg.Log.Error("read trust bundle", "err", err)
		return nil, status.Error(codes.Internal, string(errs.Internal))
	}
	return &nodev1.RenewResponse{CertChainDer: chain, Bundle: b}, nil
}

// ReasonSecretOffSession is the reason a secret request is refused when it
// does not come on the connection of its node's live session on this
// gateway: a copy of a node's files dials its own connection, and must
// then say Hello, which counts it as a duplicate boot.
const ReasonSecretOffSession = "not-on-live-session"

// Secret relays a secret request from an authenticated node to the broker
// and returns its JWE. It is answered only on the connection of the node's
// live session with the same certificate (ReasonSecretOffSession). Any
// refusal is one generic ACCESS_DENIED.
func (g *Gateway) Secret(ctx context.Context, req *nodev1.SecretRequest) (*nodev1.SecretResponse, error) {
	c, err := mustCaller(ctx, nodev1.Gateway_Secret_FullMethodName)
	if err != nil {
		return nil, err
	}
	id := c.id
	if !g.onLiveSession(id, peerAddr(ctx)) {
		g.cfg.Log.Info("call refused", "method", nodev1.Gateway_Secret_FullMethodName, "node_id", id.NodeID, "reason", ReasonSecretOffSession)
		g.svc.Refused(ctx, refusals[nodev1.Gateway_Secret_FullMethodName].event, ReasonSecretOffSession, id.NodeID)
		return nil, errAccessDenied
	}
	jwe, err := g.svc.Secret(ctx, id, peerChain(ctx), req)
	if err != nil {
		if errs.CodeOf(err) == errs.Internal {
			g.cfg.Log.Error("secret request failed", "node_id", id.NodeID, "err", err)
			return nil, status.Error(codes.Internal, string(errs.Internal))
		}
		return nil, status.Error(codes.PermissionDenied, string(errs.AccessDenied))
	}
	return &nodev1.SecretResponse{Jwe: jwe}, nil
}

// onLiveSession reports whether id's node has a live session on this
// gateway, of id's certificate, on the connection from addr.
func (g *Gateway) onLiveSession(id pki.NodeIdentity, addr string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.sessions[id.NodeID]
	return s != nil && addr != "" && s.peer == addr && s.serial == id.Serial && s.ctx.Err() == nil
}

// peerAddr is the remote address of the call's connection ("" unknown).
func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

// BootTag is what the control plane keeps and shows of a node's boot id: a
// keyless digest of it. The boot id a node process draws at random is what
// tells two machines holding one identity apart; shown as is (nodes.get,
// events, logs), a copy of a node's files could present the original's and
// alternate with it unseen. The digest tells boots apart just as well and
// gives a clone nothing to present.
func BootTag(bootID string) string {
	sum := sha256.Sum256([]byte("bc-boot-v1\x00" + bootID))
	return "bt" + hex.EncodeToString(sum[:10])
}
