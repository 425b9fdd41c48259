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
	"errors"
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
	// MarkSent records that the commands were sent.
	MarkSent(ctx context.Context, ids []string) error
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
}

// Poker delivers pokes (the in-process bus implements it).
type Poker interface {
	Subscribe(topic string) (<-chan struct{}, func())
}

// Config configures a gateway. NodeRoots and TrustDomain are required:
// there is no weaker default.
type Config struct {
	TrustDomain    string
	NodeRoots      *x509.CertPool
	ServerCert     tls.Certificate
	GatewayID      string
	Clock          clock.Clock
	Log            *slog.Logger
	RevocationPoll time.Duration // default 1s; also how often sessions moved to another gateway are looked for
	// Heartbeat is how often the gateway refreshes its sessions' heartbeat
	// in the registry (default 10s, nodes.SessionHeartbeat); a session not
	// refreshed within the registry's window went quiet.
	Heartbeat   time.Duration
	CommandPoll time.Duration // default 250ms: one dispatch round (nodes with work, then their commands) per interval for the whole gateway
}

// Gateway serves the Gateway gRPC service.
type Gateway struct {
	nodev1.UnimplementedGatewayServer
	cfg  Config
	reg  Registry
	cmds Commands
	svc  Services
	poke Poker

	// mu guards sessions and the delivery state below (see dispatch).
	mu       sync.Mutex
	sessions map[string]*session // by node id
	inflight map[string]bool     // command ids handed to a session and not yet recorded as sent
	sent     []string            // ids sessions sent since dispatch last recorded them
	want     map[string]bool     // nodes to fetch commands for in dispatch's next round

	dpoke   chan struct{}       // wakes dispatch; coalesced
	updates chan *pendingUpdate // to the update batcher
}

// pendingUpdate is one update waiting for the batcher, and where its
// result goes.
type pendingUpdate struct {
	item wire.UpdateItem
	done chan wire.UpdateResult
}

// maxUpdateBatch bounds how many updates go into one transaction.
const maxUpdateBatch = 1024

// batchUpdates writes updates from every session in shared transactions:
// it takes what is waiting (up to maxUpdateBatch) as soon as one arrives,
// so a quiet gateway adds no delay and a busy one amortises each commit.
func (g *Gateway) batchUpdates(ctx context.Context) {
	for {
		var batch []*pendingUpdate
		select {
		case <-ctx.Done():
			return
		case p := <-g.updates:
			batch = append(batch, p)
		}
	fill:
		for len(batch) < maxUpdateBatch {
			select {
			case p := <-g.updates:
				batch = append(batch, p)
			default:
				break fill
			}
		}
		items := make([]wire.UpdateItem, len(batch))
		for i, p := range batch {
			items[i] = p.item
		}
		res := g.cmds.ApplyUpdates(ctx, items)
		for i, p := range batch {
			p.done <- res[i]
		}
	}
}

type session struct {
	id     string
	nodeID string
	serial string
	cancel context.CancelCauseFunc
	poke   chan struct{} // wakes deliver; coalesced

	// Guarded by Gateway.mu: commands dispatch handed over and deliver has
	// not taken yet.
	outbox []*nodev1.SignedCommand
}

// wake wakes a session's deliver loop without blocking.
func (s *session) wake() {
	select {
	case s.poke <- struct{}{}:
	default:
	}
}

// ErrInvalidConfig is wrapped by New for a gateway without node-CA roots or
// a trust domain.
var ErrInvalidConfig = errs.New(errs.InvalidConfig, "gateway needs node-CA roots and a trust domain")

// New checks cfg and returns a gateway. It refuses (INVALID_CONFIG) to be
// built without node-CA roots, a trust domain or a server certificate.
func New(cfg Config, svc Services, reg Registry, cmds Commands, poke Poker) (*Gateway, error) {
	if cfg.NodeRoots == nil || cfg.TrustDomain == "" || len(cfg.ServerCert.Certificate) == 0 {
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
	return &Gateway{cfg: cfg, reg: reg, cmds: cmds, svc: svc, poke: poke, sessions: map[string]*session{},
		inflight: map[string]bool{}, want: map[string]bool{}, dpoke: make(chan struct{}, 1), updates: make(chan *pendingUpdate, maxUpdateBatch)}, nil
}

// TLSConfig is the server side: TLS 1.3 only; a client certificate is
// requested but checked per call, since Join and Bundle accept none.
func (g *Gateway) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{g.cfg.ServerCert},
		ClientAuth:   tls.RequestClientCert,
	}
}

// GRPCServer returns a gRPC server with the gateway registered on TLS.
func (g *Gateway) GRPCServer() *grpc.Server {
	s := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(g.TLSConfig())),
		grpc.MaxRecvMsgSize(nodev1.MaxMessageBytes),
		grpc.MaxSendMsgSize(nodev1.MaxMessageBytes),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)
	nodev1.RegisterGatewayServer(s, g)
	return s
}

// Run closes sessions of revoked or expired certificates, and sessions
// whose node opened a newer session on another gateway, until ctx ends; it
// keeps this gateway's sessions' heartbeat fresh in the registry. It first
// marks this gateway's stale sessions closed.
func (g *Gateway) Run(ctx context.Context) {
	if err := g.reg.CloseGatewaySessions(ctx, g.cfg.GatewayID); err != nil {
		g.cfg.Log.Error("close stale sessions", "err", err)
	}
	go g.dispatch(ctx)
	go g.batchUpdates(ctx)
	go g.heartbeat(ctx)
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
	for _, s := range g.sessions {
		if revoked[s.serial] {
			s.cancel(errRevoked)
		}
	}
	g.mu.Unlock()
	return next, nil
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

var (
	errRevoked    = errors.New("certificate revoked")
	errSuperseded = errors.New("session superseded")
	errExpired    = errors.New("certificate expired")
)

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

var errUnauthenticated = status.Error(codes.Unauthenticated, string(errs.Unauthenticated))

// reasonSuperseded is the revocation reason of a certificate a renewal
// replaced (nodes.ReasonSuperseded; the gateway does not import nodes).
const reasonSuperseded = "superseded"

// authenticate checks the caller's client certificate: chain to the node
// CA, trust domain, role and expiry, then revocation and role in the
// registry. Any failure is UNAUTHENTICATED with a reason for the log and
// the event log.
func (g *Gateway) authenticate(ctx context.Context) (pki.NodeIdentity, CertInfo, string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return pki.NodeIdentity{}, CertInfo{}, "no-peer", errUnauthenticated
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return pki.NodeIdentity{}, CertInfo{}, "no-client-certificate", errUnauthenticated
	}
	id, err := pki.VerifyNodeChain(ti.State.PeerCertificates, g.cfg.NodeRoots, g.cfg.TrustDomain, g.cfg.Clock.Now())
	if err != nil {
		g.cfg.Log.Info("node certificate does not verify", "peer", p.Addr.String(), "err", err)
		return pki.NodeIdentity{}, CertInfo{}, "certificate-invalid", errUnauthenticated
	}
	ci, err := g.reg.CertInfo(ctx, id.Serial)
	switch {
	case err != nil:
		g.cfg.Log.Info("node certificate unknown", "node_id", id.NodeID, "err", err)
		return id, ci, "certificate-unknown", errUnauthenticated
	case ci.Revoked && ci.RevokeReason == reasonSuperseded && ci.NodeID == id.NodeID:
		// The node renewed and uses its new certificate: whoever still
		// holds the old one holds a copy of the identity.
		if q, err := g.reg.SupersededCertificateUsed(ctx, id.NodeID, id.Serial); err != nil {
			g.cfg.Log.Error("record superseded certificate", "node_id", id.NodeID, "err", err)
		} else if q {
			g.cfg.Log.Warn("node quarantined", "node_id", id.NodeID, "serial", id.Serial)
		}
		return id, ci, "certificate-superseded", errUnauthenticated
	case ci.Revoked:
		return id, ci, "certificate-revoked", errUnauthenticated
	case ci.NodeID != id.NodeID || ci.Role != id.Role:
		return id, ci, "certificate-mismatch", errUnauthenticated
	}
	return id, ci, "", nil
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

// peerChain returns the DER of the client certificate chain on ctx.
func peerChain(ctx context.Context) [][]byte {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil
	}
	var out [][]byte
	for _, c := range ti.State.PeerCertificates {
		out = append(out, c.Raw)
	}
	return out
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
	id, _, reason, err := g.authenticate(ctx)
	if err != nil {
		g.cfg.Log.Info("renew refused", "node_id", id.NodeID, "reason", reason)
		g.svc.Refused(ctx, "security.renew.refused", reason, id.NodeID)
		return nil, status.Error(codes.PermissionDenied, string(errs.AccessDenied))
	}
	chain, err := g.svc.Renew(ctx, id, peerChain(ctx), req.GetCsrDer(), req.GetProof())
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

// Secret relays a secret request from an authenticated node to the broker
// and returns its JWE. Any refusal is one generic ACCESS_DENIED.
func (g *Gateway) Secret(ctx context.Context, req *nodev1.SecretRequest) (*nodev1.SecretResponse, error) {
	id, _, reason, err := g.authenticate(ctx)
	if err != nil {
		g.svc.Refused(ctx, "security.secret.refused", reason, id.NodeID)
		return nil, status.Error(codes.PermissionDenied, string(errs.AccessDenied))
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

// Session holds a node's stream: Hello, Welcome, then commands out and
// updates in, until the node leaves, a newer boot supersedes it, or its
// certificate is revoked.
func (g *Gateway) Session(stream nodev1.Gateway_SessionServer) error {
	ctx := stream.Context()
	id, ci, reason, err := g.authenticate(ctx)
	if err != nil {
		g.cfg.Log.Info("session refused", "node_id", id.NodeID, "reason", reason)
		g.svc.Refused(ctx, "security.session.refused", reason, id.NodeID)
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil || hello.NodeId != id.NodeID || hello.BootId == "" || len(hello.BootId) > 64 {
		g.cfg.Log.Info("node refused", "node_id", id.NodeID, "why", "first message is not a Hello for this node")
		return status.Error(codes.PermissionDenied, string(errs.AccessDenied))
	}
	inv, err := inventoryJSON(hello.Inventory)
	if err != nil {
		return status.Error(codes.InvalidArgument, string(errs.InvalidInput))
	}
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	s := &session{id: ids.New("s"), nodeID: id.NodeID, serial: id.Serial, cancel: cancel, poke: make(chan struct{}, 1)}
	bootTag := BootTag(hello.BootId)
	res, err := g.reg.OpenSession(ctx, HelloInfo{NodeID: id.NodeID, BootID: bootTag, Serial: id.Serial, SessionID: s.id,
		GatewayID: g.cfg.GatewayID, Version: hello.Version, Labels: hello.Labels, Inventory: inv})
	if err != nil {
		g.cfg.Log.Error("open session", "node_id", id.NodeID, "err", err)
		return status.Error(codes.Internal, string(errs.Internal))
	}
	if res.Quarantined {
		g.cfg.Log.Warn("node quarantined", "node_id", id.NodeID, "serial", id.Serial)
		g.dropSessions(id.NodeID, errRevoked)
		return errUnauthenticated
	}
	// Before the session can be handed commands: none of a kind its
	// certificate does not allow may reach its outbox.
	if n, err := g.cmds.CancelDisallowed(ctx, id.NodeID, ci.Role, ci.AllowedKinds); err != nil {
		g.cfg.Log.Error("cancel disallowed kinds", "node_id", id.NodeID, "err", err)
		return status.Error(codes.Internal, string(errs.Internal))
	} else if n > 0 {
		g.cfg.Log.Info("cancelled commands not allowed for certificate", "node_id", id.NodeID, "count", n)
	}
	g.mu.Lock()
	if old := g.sessions[id.NodeID]; old != nil {
		old.cancel(errSuperseded)
	}
	g.sessions[id.NodeID] = s
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		if g.sessions[id.NodeID] == s {
			delete(g.sessions, id.NodeID)
		}
		// What was handed to this session and not sent goes back to the
		// queue: dispatch fetches it again for the node's next session.
		for _, c := range s.outbox {
			delete(g.inflight, c.Id)
		}
		s.outbox = nil
		g.mu.Unlock()
		if err := g.reg.CloseSession(context.WithoutCancel(ctx), id.NodeID, s.id); err != nil {
			g.cfg.Log.Error("close session", "node_id", id.NodeID, "err", err)
		}
	}()

	var sendMu sync.Mutex
	send := func(m *nodev1.ServerMessage) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(m)
	}
	sets, err := g.svc.ApproverSets(ctx)
	if err != nil {
		g.cfg.Log.Error("read approver sets", "node_id", id.NodeID, "err", err)
		return status.Error(codes.Internal, string(errs.Internal))
	}
	// A statement that cannot be read leaves the node on its own clock.
	st, err := g.svc.TimeStatement(ctx)
	if err != nil {
		g.cfg.Log.Error("read time statement", "node_id", id.NodeID, "err", err)
		st = nil
	}
	if err := send(&nodev1.ServerMessage{Msg: &nodev1.ServerMessage_Welcome{Welcome: &nodev1.Welcome{
		ServerTimeMs: g.cfg.Clock.Now().UnixMilli(), SessionId: s.id, AllowedKinds: ci.AllowedKinds, ApproverSets: sets, Time: st}}}); err != nil {
		return err
	}
	g.cfg.Log.Info("session open", "node_id", id.NodeID, "session_id", s.id, "boot_id", bootTag)

	// A session lives no longer than its certificate: the node renews
	// before expiry and reconnects with the new one.
	expiry := time.AfterFunc(id.NotAfter.Sub(g.cfg.Clock.Now()), func() { cancel(errExpired) })
	defer expiry.Stop()
	recvErr := make(chan error, 1)
	go func() { recvErr <- g.receive(sctx, stream, id.NodeID, id.Serial, send) }()
	go g.deliver(sctx, s, send)
	go g.deliverApproverSets(sctx, id.NodeID, send)

	select {
	case err := <-recvErr:
		cancel(err)
		return nil
	case <-sctx.Done():
		cause := context.Cause(sctx)
		g.cfg.Log.Info("session closed", "node_id", id.NodeID, "session_id", s.id, "why", cause)
		if errors.Is(cause, errRevoked) || errors.Is(cause, errExpired) {
			return errUnauthenticated
		}
		return status.Error(codes.Aborted, "session closed")
	}
}

// dropSessions cancels the node's live session on this gateway.
func (g *Gateway) dropSessions(nodeID string, cause error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if s := g.sessions[nodeID]; s != nil {
		s.cancel(cause)
	}
}

func (g *Gateway) receive(ctx context.Context, stream nodev1.Gateway_SessionServer, nodeID, serial string, send func(*nodev1.ServerMessage) error) error {
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		switch msg := m.Msg.(type) {
		case *nodev1.NodeMessage_Update:
			p := &pendingUpdate{item: wire.UpdateItem{NodeID: nodeID, Update: msg.Update}, done: make(chan wire.UpdateResult, 1)}
			select {
			case g.updates <- p:
			case <-ctx.Done():
				return ctx.Err()
			}
			var r wire.UpdateResult
			select {
			case r = <-p.done:
			case <-ctx.Done():
				return ctx.Err()
			}
			if r.Err != nil {
				g.cfg.Log.Warn("update refused", "node_id", nodeID, "err", r.Err)
				continue
			}
			if err := send(&nodev1.ServerMessage{Msg: &nodev1.ServerMessage_Ack{Ack: &nodev1.UpdateAck{CommandId: r.CommandID, State: r.State}}}); err != nil {
				return err
			}
		case *nodev1.NodeMessage_SandboxReport:
			// Relayed as is: the sandboxes module checks the signature and
			// that the sandbox is this node's.
			id, err := g.svc.SandboxReport(ctx, nodeID, serial, msg.SandboxReport)
			if err != nil {
				g.cfg.Log.Warn("sandbox report refused", "node_id", nodeID, "err", err)
				continue
			}
			if err := send(&nodev1.ServerMessage{Msg: &nodev1.ServerMessage_SandboxAck{SandboxAck: &nodev1.SandboxReportAck{SandboxId: id}}}); err != nil {
				return err
			}
		case *nodev1.NodeMessage_Ping:
			if err := send(&nodev1.ServerMessage{Msg: &nodev1.ServerMessage_Ping{Ping: &nodev1.Ping{TimeMs: g.cfg.Clock.Now().UnixMilli()}}}); err != nil {
				return err
			}
		default:
			return fmt.Errorf("gateway: unexpected message %T", m.Msg)
		}
	}
}

// deliverApproverSets sends the approver-set chain again whenever it
// changes (poked on the bus; other processes' changes reach a node at its
// next session).
func (g *Gateway) deliverApproverSets(ctx context.Context, nodeID string, send func(*nodev1.ServerMessage) error) {
	poke, stop := g.poke.Subscribe(bus.TopicApprovers)
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-poke:
		}
		sets, err := g.svc.ApproverSets(ctx)
		if err != nil {
			if ctx.Err() == nil {
				g.cfg.Log.Error("read approver sets", "node_id", nodeID, "err", err)
			}
			continue
		}
		if err := send(&nodev1.ServerMessage{Msg: &nodev1.ServerMessage_ApproverSets{ApproverSets: &nodev1.ApproverSets{Sets: sets}}}); err != nil {
			return
		}
	}
}

// perNodeBatch bounds how many commands dispatch hands one session per
// round; a session that sends a full batch asks for the next.
const perNodeBatch = 64

// deliver sends what dispatch put in the session's outbox, in order, and
// reports what it sent. A poke on the node's bus topic (this process
// signed something for it) asks dispatch to fetch for this node.
func (g *Gateway) deliver(ctx context.Context, s *session, send func(*nodev1.ServerMessage) error) {
	busPoke, stop := g.poke.Subscribe(bus.NodeTopic(s.nodeID))
	defer stop()
	g.wantNode(s.nodeID) // what was queued before the session came up
	for {
		g.mu.Lock()
		batch := s.outbox
		s.outbox = nil
		g.mu.Unlock()
		for i, c := range batch {
			if err := send(&nodev1.ServerMessage{Msg: &nodev1.ServerMessage_Command{Command: c}}); err != nil {
				g.release(batch[i:])
				return
			}
			g.mu.Lock()
			g.sent = append(g.sent, c.Id)
			g.mu.Unlock()
		}
		switch {
		case len(batch) >= perNodeBatch:
			g.wantNode(s.nodeID) // there may be more
		case len(batch) > 0:
			g.pokeDispatch() // record what was sent
		}
		select {
		case <-ctx.Done():
			return
		case <-busPoke:
			g.wantNode(s.nodeID)
		case <-s.poke:
		}
	}
}

// release returns commands a session took but could not send to the
// queue (they stay queued in the database; dispatch fetches them again).
func (g *Gateway) release(cmds []*nodev1.SignedCommand) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range cmds {
		delete(g.inflight, c.Id)
	}
}

// wantNode asks dispatch to fetch nodeID's queued commands.
func (g *Gateway) wantNode(nodeID string) {
	g.mu.Lock()
	g.want[nodeID] = true
	g.mu.Unlock()
	g.pokeDispatch()
}

func (g *Gateway) pokeDispatch() {
	select {
	case g.dpoke <- struct{}{}:
	default:
	}
}

// dispatch moves signed commands from the database to the sessions, for
// the whole gateway at once: each round it first records in one statement
// what the sessions sent since the last round, then fetches in one query
// the queued commands of the nodes that asked (a new session, a poke) or,
// every CommandPoll and whenever a batch was signed here or in another
// process (PostgreSQL NOTIFY), of every node with work waiting, and puts
// them in the sessions' outboxes. A command is in flight from the moment
// it is handed to a session until its sent state is recorded, and is never
// handed out twice meanwhile; because recording comes before fetching in
// the same goroutine, a fetch never sees a command as queued that a
// session already sent and dispatch already forgot. That holds within one
// gateway: a node that moves to another gateway before its last commands
// were recorded as sent (one round) gets them again there, and answers
// the copies as replays with the results it journaled, which changes
// nothing.
func (g *Gateway) dispatch(ctx context.Context) {
	t := time.NewTicker(g.cfg.CommandPoll)
	defer t.Stop()
	local, stopLocal := g.poke.Subscribe(bus.TopicSigned)
	defer stopLocal()
	remote, stopRemote := g.poke.Subscribe(bus.RemoteTopic(bus.TopicSigned))
	defer stopRemote()
	for {
		all := false
		select {
		case <-ctx.Done():
			// Record what was sent before the stop, so the next gateway does
			// not send it again (the node would answer a copy as a replay).
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			g.recordSent(fctx)
			cancel()
			return
		case <-t.C:
			all = true
		case <-local:
			all = true
		case <-remote:
			all = true
		case <-g.dpoke:
		}
		g.recordSent(ctx)
		g.fetch(ctx, all)
	}
}

// recordSent marks what the sessions sent; on failure the ids stay in
// flight and are tried again next round.
func (g *Gateway) recordSent(ctx context.Context) {
	g.mu.Lock()
	ids := g.sent
	g.sent = nil
	g.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	if err := g.cmds.MarkSent(ctx, ids); err != nil {
		if ctx.Err() == nil {
			g.cfg.Log.Error("mark commands sent", "count", len(ids), "err", err)
		}
		g.mu.Lock()
		g.sent = append(g.sent, ids...)
		g.mu.Unlock()
		return
	}
	g.mu.Lock()
	for _, id := range ids {
		delete(g.inflight, id)
	}
	g.mu.Unlock()
}

// fetch hands queued commands to the sessions of the wanted nodes (and,
// when all, of every node with work waiting) whose outbox is empty.
func (g *Gateway) fetch(ctx context.Context, all bool) {
	g.mu.Lock()
	want := g.want
	g.want = map[string]bool{}
	g.mu.Unlock()
	if all {
		ids, err := g.cmds.PendingNodes(ctx)
		if err != nil && ctx.Err() == nil {
			g.cfg.Log.Error("read nodes with pending commands", "err", err)
		}
		for _, id := range ids {
			want[id] = true
		}
	}
	g.mu.Lock()
	var nodes []string
	for id := range want {
		switch s := g.sessions[id]; {
		case s == nil:
		case len(s.outbox) == 0:
			nodes = append(nodes, id)
		default:
			g.want[id] = true // still sending its last batch: next round
		}
	}
	g.mu.Unlock()
	if len(nodes) == 0 {
		return
	}
	pending, err := g.cmds.PendingFor(ctx, nodes, perNodeBatch)
	if err != nil {
		if ctx.Err() == nil {
			g.cfg.Log.Error("read pending commands", "nodes", len(nodes), "err", err)
		}
		g.mu.Lock()
		for _, id := range nodes {
			g.want[id] = true
		}
		g.mu.Unlock()
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for nodeID, cmds := range pending {
		s := g.sessions[nodeID] // a session in the map has not ended
		if s == nil {
			continue
		}
		added := false
		for _, c := range cmds {
			if g.inflight[c.Id] {
				continue
			}
			g.inflight[c.Id] = true
			s.outbox = append(s.outbox, c)
			added = true
		}
		if added {
			s.wake()
		}
	}
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
