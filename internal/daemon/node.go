// Package daemon is bcd's node agent: join, the mutual-TLS session with a
// gateway, verification of every signed command against what the node
// pinned at join, the crash-safe journal, node-signed (attested) updates,
// renewal before expiry, and reconnects with jittered back-off. Drivers
// (package driver) do the actual work.
package daemon

import (
	"cmp"
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/daemon/journal"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/tickets/spentfile"
)

// Version is reported in Hello.
const Version = "0.1.0"

// Config configures a node agent.
type Config struct {
	DataDir string
	Gateway string // overrides the join record's gateway when set
	Driver  driver.Driver
	Clock   clock.Clock
	Log     *slog.Logger
	BootID  string // default: a fresh id per process
	Labels  map[string]string
	// Backoff bounds reconnect delays (defaults 200ms to 30s, full jitter).
	MinBackoff, MaxBackoff time.Duration
	// RunningAfter is how long a command may run before the node signs and
	// sends its "running" update. A command that finishes sooner reports
	// only its final state, which spares a signature and a message for the
	// many commands that take a moment (a fan-out's diag.run); one still
	// running after RunningAfter is reported running then, so the control
	// plane sees that it started. Zero means DefaultRunningAfter; a
	// negative value reports running at once, before the driver starts
	// (tests that want every update).
	RunningAfter time.Duration
	// ResendAfter is how long the node waits, by Config.Clock, for the
	// control plane's ack of a result it sent before it sends the result
	// again on the same session; each further wait doubles, up to
	// MaxResendWait. Zero means DefaultResendAfter.
	ResendAfter time.Duration
	// WorkerChains memoises verified worker chains (see
	// pki.WorkerChainCache). Nil: Open makes one for this node. Nodes of
	// one process may share one (fleetsim does): the memo answers exactly
	// as the full verification, and each node still checks the signature
	// over its own command and every field of it.
	WorkerChains *pki.WorkerChainCache
	// MinFreeBytes is the space the data folder must have free for the
	// node to take a new command (statfs, what an unprivileged writer may
	// use); below it, new commands are refused data-dir-full, and the
	// space left is for what commands already taken still write (their
	// results, acks, refusals). Zero means DefaultMinFreeBytes; negative
	// turns the check off (a journal write that fails with ENOSPC still
	// refuses).
	MinFreeBytes int64
	// TunnelPorts is the node's tunnel allow list: a tunnel reaches only
	// 127.0.0.1:<port> for a port listed here (bcd node --tunnel-port).
	// Nil means DefaultTunnelPorts (22 only).
	TunnelPorts []uint32
	// HelperEvents, when set, drains the root helper's events (an
	// unprivileged node's bcd helper) every HelperPoll; the node relays
	// them on its session for the control plane's audit log.
	HelperEvents HelperEventSource
	// HelperPoll is how often HelperEvents is drained; zero means
	// DefaultHelperPoll.
	HelperPoll time.Duration
}

// DefaultMinFreeBytes is Config.MinFreeBytes when it is zero.
const DefaultMinFreeBytes = 4 << 20

// DefaultResendAfter is Config.ResendAfter when it is zero: how long a
// node waits for the ack of a result before it sends the result again on
// the same session.
const DefaultResendAfter = 15 * time.Second

// DefaultRunningAfter is Config.RunningAfter when it is zero.
const DefaultRunningAfter = time.Second

// Node is a running node agent.
type Node struct {
	cfg       Config
	rec       *JoinRecord  // node id and gateway; the trust part is pinned's
	pinned    *pinnedTrust // the join record's trust bundle, refreshed (refresh.go)
	verify    *Verifier
	journal   *journal.Journal
	approvers *approvers

	mu        sync.Mutex
	key       crypto.Signer
	chain     []*x509.Certificate
	highestMS int64     // the latest signed time statement ever accepted (state.json)
	timeMS    int64     // the statement that sets the time in this process,
	timeAt    time.Time // read at timeAt by the node's own clock
	connected bool
	sessionID string
	// sessionConn is the live session's connection (nil between
	// sessions): the gateway answers a secret request only on it.
	sessionConn *grpc.ClientConn
	refusals    map[string]int // commands refused since Open, by reason
	intent      []byte         // the last verified SignedDesiredState (intent.go)
	intentGen   uint64         // its generation
	onIntent    func(generation uint64, err error)

	// onState, when set, is told of session changes (tests and dev wait on
	// it instead of sleeping).
	onState func(connected bool)
	// onRevocation, when set, is told of each revocation-feed entry the
	// node took or refused (OnRevocation).
	onRevocation func(kind, reason string)

	// reports are the sandbox reports awaiting their ack.
	reports *reports
	// adoption is the adoption of the sandboxes found at open (reports.go).
	adoption adoption
	// hev are the root helper's events awaiting their ack.
	hev *helperEvents
	// outbox holds the results awaiting their ack, for whichever session
	// is live to send.
	outbox *outbox

	// pacing is how Run waits between sessions (see Run).
	pacing pacing
	// seen is the replay check handle gives the verifier (the journal's
	// Seen; a test wraps it to hold two deliveries of one command side by
	// side at that point).
	seen func(id string) bool

	// tunnels is the node's side of tunnels (tunnel.go).
	tunnels *tunnels
	// executors counts the sessions' command executors still running.
	executors sync.WaitGroup
}

// pacing is the reconnect back-off's clock and jitter: the wall clock and
// full jitter (a uniform draw in [0, ceiling]) unless a test sets them.
type pacing struct {
	clock  clock.Clock
	jitter func(ceiling time.Duration) time.Duration
}

// fullJitter draws a delay uniformly in [0, ceiling].
func fullJitter(ceiling time.Duration) time.Duration {
	return time.Duration(mrand.Int64N(int64(ceiling) + 1))
}

// Open loads a joined node from cfg.DataDir and its journal. It reports
// (and journals) commands interrupted by a crash as failed, so they are not
// run again and their result reaches the control plane.
func Open(cfg Config) (*Node, error) {
	cfg, err := withDefaults(cfg)
	if err != nil {
		return nil, err
	}
	n, err := load(cfg)
	if err != nil {
		return nil, err
	}
	if sf, ok := cfg.Driver.(SandboxFailures); ok {
		sf.OnSandboxFailed(n.ReportSandboxFailed)
	}
	if a, ok := cfg.Driver.(SandboxAdopter); ok {
		n.adoption.by = a
		n.adoptSandboxes(context.Background())
	}
	if err := n.failInterrupted(); err != nil {
		return nil, err
	}
	n.loadIntent()
	return n, nil
}

// withDefaults fills in cfg's zero fields; a driver is required.
func withDefaults(cfg Config) (Config, error) {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.BootID == "" {
		cfg.BootID = ids.New("b")
	}
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff = 200 * time.Millisecond
	}
	if cfg.MaxBackoff == 0 {
		cfg.MaxBackoff = 30 * time.Second
	}
	if cfg.RunningAfter == 0 {
		cfg.RunningAfter = DefaultRunningAfter
	}
	if cfg.ResendAfter <= 0 {
		cfg.ResendAfter = DefaultResendAfter
	}
	if cfg.WorkerChains == nil {
		cfg.WorkerChains = pki.NewWorkerChainCache(0)
	}
	if cfg.MinFreeBytes == 0 {
		cfg.MinFreeBytes = DefaultMinFreeBytes
	}
	if cfg.Driver == nil {
		return cfg, errors.New("daemon: no driver")
	}
	return cfg, nil
}

// readJoin reads the join record in dir and verifies its trust bundle
// under the join-key pin it holds.
func readJoin(dir string) (*JoinRecord, pki.TrustBundle, error) {
	var rec JoinRecord
	if err := readJSON(dir, joinFile, &rec); err != nil {
		return nil, pki.TrustBundle{}, ErrNotJoined
	}
	var pin [32]byte
	copy(pin[:], rec.Pin)
	tb, err := pki.VerifyTrustBundle(rec.BundleBody, rec.BundleSig, ed25519.PublicKey(rec.JoinPublicKey), pin)
	if err != nil {
		return nil, pki.TrustBundle{}, fmt.Errorf("daemon: join record's trust bundle does not verify: %w", err)
	}
	return &rec, tb, nil
}

// load reads the node's files under cfg.DataDir (join record, identity,
// approver sets, state, journal) into a Node.
func load(cfg Config) (*Node, error) {
	rec, tb, err := readJoin(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	var id identity
	if err := readSecretJSON(cfg.DataDir, identityFile, &id); err != nil {
		return nil, fmt.Errorf("daemon: identity: %w", err)
	}
	key, chain, err := id.parse()
	if err != nil {
		return nil, err
	}
	nid, err := pki.ParseNodeCert(chain[0])
	if err != nil {
		return nil, fmt.Errorf("daemon: node certificate: %w", err)
	}
	roots, err := tb.CommandRootCerts()
	if err != nil {
		return nil, fmt.Errorf("daemon: command roots: %w", err)
	}
	ap, err := newApprovers(tb, cfg.DataDir)
	if err != nil {
		return nil, err
	}
	var st state
	_ = readJSON(cfg.DataDir, stateFile, &st)
	j, err := journal.Open(filepath.Join(cfg.DataDir, journalFile), cfg.Clock.Now(), MaxLifetime+MaxSkew)
	if err != nil {
		return nil, err
	}
	if err := j.CompactErr(); err != nil {
		cfg.Log.Warn("journal not compacted, data folder not writable", "err", err)
	}
	spent, err := spentfile.Open(filepath.Join(cfg.DataDir, spentFile), cfg.Clock, MaxSpentTickets)
	if err != nil {
		return nil, err
	}
	if err := spent.CompactErr(); err != nil {
		cfg.Log.Warn("spent tickets not compacted, data folder not writable", "err", err)
	}
	if cfg.Gateway == "" {
		cfg.Gateway = rec.Gateway
	}
	pinned := newPinnedTrust(*rec, tb, roots)
	return &Node{cfg: cfg, rec: rec, pinned: pinned, journal: j, key: key, chain: chain, highestMS: st.HighestServerTimeMS, approvers: ap,
		verify: &Verifier{NodeID: rec.NodeID, Role: nid.Role, TrustDomain: tb.TrustDomain, CommandRoots: roots,
			Deployment: tb.Deployment, Approvers: ap.current, WorkerChains: cfg.WorkerChains, CurrentRoots: pinned.commandRoots}, reports: newReports(), hev: newHelperEvents(), outbox: newOutbox(cfg.ResendAfter),
		pacing: pacing{clock: clock.Real{}, jitter: fullJitter}, seen: j.Seen,
		tunnels: newTunnels(cfg, spent, time.UnixMilli(max(st.HighestServerTimeMS, cfg.Clock.Now().UnixMilli())))}, nil
}

// failInterrupted reports (and journals) every command a crash
// interrupted as failed, reason interrupted.
func (n *Node) failInterrupted() error {
	for _, r := range n.journal.Interrupted() {
		upd, err := n.signUpdate(&nodev1.UpdateBody{CommandId: r.ID, State: string(wire.StateFailed), Reason: "interrupted", Kind: r.Kind, PayloadSha256: r.PayloadSHA256})
		if err != nil {
			return err
		}
		if err := n.journal.Done(r.ID, time.UnixMilli(r.ExpiresMS), upd); err != nil {
			if !errors.Is(err, journal.ErrNotDurable) {
				return err
			}
			// Kept in memory and sent: the node's word that the command
			// did not finish reaches the control plane even now.
			n.cfg.Log.Warn("result not journaled, data folder not writable", "command_id", r.ID, "err", err)
		}
		n.cfg.Log.Warn("command interrupted by restart", "command_id", r.ID)
	}
	return nil
}

// NodeID returns this node's id.
func (n *Node) NodeID() string { return n.rec.NodeID }

// BootID returns this process's boot id.
func (n *Node) BootID() string { return n.cfg.BootID }

// Close closes the journal.
func (n *Node) Close() error { return n.journal.Close() }

// OnState registers f to be told when the session comes up or goes down.
func (n *Node) OnState(f func(connected bool)) {
	n.mu.Lock()
	n.onState = f
	n.mu.Unlock()
}

// Refusals returns how many commands this node refused since Open, by
// reason (a copy). It counts messages refused before their signature
// verified too: those are only logged and counted here, never journaled
// or answered.
func (n *Node) Refusals() map[string]int {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make(map[string]int, len(n.refusals))
	for k, v := range n.refusals {
		out[k] = v
	}
	return out
}

// Connected reports whether a session is up.
func (n *Node) Connected() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.connected
}

func (n *Node) setConnected(c bool) {
	n.mu.Lock()
	n.connected = c
	f := n.onState
	n.mu.Unlock()
	if f != nil {
		f(c)
	}
}

// now is the node's idea of the time: its own clock, but never earlier
// than the signed time statement it accepted in this process plus the time
// elapsed since by its own clock (monotonic when it is the real clock), nor
// than the highest statement time it ever accepted. Signed statements are
// lower bounds on the time, so they can only move it forward.
func (n *Node) now() time.Time {
	local := n.cfg.Clock.Now()
	n.mu.Lock()
	highest, stMS, at := n.highestMS, n.timeMS, n.timeAt
	n.mu.Unlock()
	t := local
	if !at.IsZero() {
		if c := time.UnixMilli(stMS).Add(local.Sub(at)); c.After(t) {
			t = c
		}
	}
	if h := time.UnixMilli(highest); h.After(t) {
		t = h
	}
	return t
}

// Serial returns the current certificate's serial (hex).
func (n *Node) Serial() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return pki.SerialHex(n.chain[0])
}

// SignUpdate encodes and signs an update body with the current node key
// and returns the marshalled CommandUpdate (what the journal keeps).
func (n *Node) SignUpdate(b *nodev1.UpdateBody) ([]byte, error) { return n.signUpdate(b) }

// boundTo names in u the command it reports on: the kind and the SHA-256
// of the payload of body, when body is the verified body of u's command
// (nothing otherwise). The control plane attests an update only when both
// match the command it names, so a signed result cannot be moved to
// another command.
func boundTo(u *nodev1.UpdateBody, body *nodev1.CommandBody) *nodev1.UpdateBody {
	if body != nil && body.CommandId == u.CommandId {
		sum := sha256.Sum256(body.Payload)
		u.Kind, u.PayloadSha256 = body.Kind, sum[:]
	}
	return u
}

// sign signs body under sigContext with the current node key
// (wire.SignNode) and names the certificate it belongs to. Every statement
// a node makes (updates, sandbox reports, secret requests, renewal
// proofs) is signed here, each under its own context, so that one kind's
// signature is never taken for another's.
func (n *Node) sign(sigContext string, body []byte) (sig []byte, serial string, err error) {
	n.mu.Lock()
	key, serial := n.key, pki.SerialHex(n.chain[0])
	n.mu.Unlock()
	sig, err = wire.SignNode(key, sigContext, body)
	return sig, serial, err
}

// signUpdate encodes and signs an update body with the current node key.
func (n *Node) signUpdate(b *nodev1.UpdateBody) ([]byte, error) {
	b.NodeId = n.rec.NodeID
	b.TimeMs = n.now().UnixMilli()
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("daemon: encode update: %w", err)
	}
	sig, serial, err := n.sign(wire.UpdateSigContext, body)
	if err != nil {
		return nil, fmt.Errorf("daemon: sign update: %w", err)
	}
	return proto.Marshal(&nodev1.CommandUpdate{Body: body, NodeSig: sig, CertSerial: serial})
}

// tlsConfig presents the current certificate and accepts only the pinned
// gateway identity.
func (n *Node) tlsConfig() (*tls.Config, error) {
	tb := n.trustBundle()
	roots, err := tb.ServerRootPool()
	if err != nil {
		return nil, err
	}
	cfg := pinnedGatewayTLS(roots, tb.TrustDomain)
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return n.ClientCertificate()
	}
	return cfg, nil
}

// ClientCertificate returns the node's current TLS identity.
func (n *Node) ClientCertificate() (*tls.Certificate, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	c := &tls.Certificate{PrivateKey: n.key, Leaf: n.chain[0]}
	for _, x := range n.chain {
		c.Certificate = append(c.Certificate, x.Raw)
	}
	return c, nil
}

// Dial opens a client connection to the gateway with this node's identity.
func (n *Node) Dial() (*grpc.ClientConn, error) {
	cfg, err := n.tlsConfig()
	if err != nil {
		return nil, err
	}
	return grpc.NewClient(n.cfg.Gateway, grpc.WithTransportCredentials(credentials.NewTLS(cfg)),
		// Updates carry results of up to nodev1.MaxMessageBytes (a sandbox
		// exec's two 8 MiB streams); the gateway accepts as much.
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(nodev1.MaxMessageBytes), grpc.MaxCallRecvMsgSize(nodev1.MaxMessageBytes)),
		// TLS buffers what it decrypted; gRPC's own 32 KiB read buffer
		// would only add memory (the gateway does the same).
		grpc.WithReadBufferSize(0),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}))
}

// Run keeps a session with the gateway until ctx ends, reconnecting with
// full-jitter exponential back-off and renewing the certificate before it
// expires. The back-off doubles after each attempt (Config.MinBackoff up
// to Config.MaxBackoff) and restarts from the minimum after a session
// that got its Welcome, however short: a gateway restart then costs the
// node a fraction of a second however many restarts came before, while a
// gateway that accepts and drops before answering Hello keeps the node
// backing off. The back-off is wall time, not Config.Clock: it paces real
// network retries, and a node on a fake clock that a test does not move
// must still reconnect (certificate lifetimes and the running delay are
// what the clock governs). When the gateway says the node's certificate is
// revoked, Run logs it once at ERROR and returns a *RevokedError (see
// ErrRevoked) instead of reconnecting.
func (n *Node) Run(ctx context.Context) error {
	defer n.executors.Wait()
	n.adoptSandboxes(ctx) // if Open could not (the helper had no desired state)
	if n.cfg.HelperEvents != nil {
		pctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			n.pollHelper(pctx, n.cfg.HelperEvents, cmp.Or(n.cfg.HelperPoll, DefaultHelperPoll))
		}()
		defer func() { stop(); <-done }()
	}
	backoff := n.cfg.MinBackoff
	for {
		welcomed, err := n.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if isRevokedStatus(err) {
			rerr := &RevokedError{NodeID: n.rec.NodeID, DataDir: n.cfg.DataDir, Gateway: n.cfg.Gateway}
			n.cfg.Log.Error("certificate revoked: not reconnecting", "node_id", n.rec.NodeID, "next", "bcd join with a new join token")
			return rerr
		}
		if welcomed {
			backoff = n.cfg.MinBackoff
		}
		n.cfg.Log.Info("session ended", "node_id", n.rec.NodeID, "welcomed", welcomed, "err", err)
		t := n.pacing.clock.NewTimer(n.pacing.jitter(backoff))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
		backoff = min(backoff*2, n.cfg.MaxBackoff)
	}
}

// renewAt is when the current certificate should be renewed: two thirds
// into its life, jittered by up to a tenth of the life either way.
func (n *Node) renewAt() time.Time {
	n.mu.Lock()
	c := n.chain[0]
	n.mu.Unlock()
	life := c.NotAfter.Sub(c.NotBefore)
	jitter := time.Duration(mrand.Int64N(int64(life/5)+1)) - life/10
	return c.NotBefore.Add(life*2/3 + jitter)
}

// Renew asks the gateway for a certificate for a fresh key over conn and
// installs it (0600, atomically).
func (n *Node) Renew(ctx context.Context, conn *grpc.ClientConn) error {
	key, err := pki.NewNodeKey()
	if err != nil {
		return fmt.Errorf("daemon: renew key: %w", err)
	}
	csr, err := pki.CSR(key, n.rec.NodeID)
	if err != nil {
		return fmt.Errorf("daemon: renew csr: %w", err)
	}
	// The chain is public; this signature by the current key proves that
	// the node itself asks for this CSR.
	proof, _, err := n.sign(wire.RenewSigContext, csr)
	if err != nil {
		return fmt.Errorf("daemon: renew proof: %w", err)
	}
	resp, err := nodev1.NewGatewayClient(conn).Renew(ctx, &nodev1.RenewRequest{CsrDer: csr, Proof: proof})
	if err != nil {
		return fmt.Errorf("daemon: renew refused: %w", err)
	}
	tb := n.trustBundle()
	roots, err := tb.NodeRootPool()
	if err != nil {
		return err
	}
	var chain []*x509.Certificate
	for _, der := range resp.CertChainDer {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return fmt.Errorf("daemon: renewed certificate: %w", err)
		}
		chain = append(chain, c)
	}
	if len(chain) == 0 || !key.PublicKey.Equal(chain[0].PublicKey) {
		return errors.New("daemon: renewed certificate is for another key")
	}
	if id, err := pki.VerifyNodeChain(chain, roots, tb.TrustDomain, chain[0].NotBefore.Add(1)); err != nil || id.NodeID != n.rec.NodeID {
		return fmt.Errorf("daemon: renewed certificate does not verify: %w", err)
	}
	keyPEM, err := pki.MarshalPrivateKeyPEM(key)
	if err != nil {
		return err
	}
	if err := writeJSON(n.cfg.DataDir, identityFile, identity{KeyPEM: keyPEM, Chain: resp.CertChainDer}); err != nil {
		return err
	}
	n.mu.Lock()
	n.key, n.chain = key, chain
	n.mu.Unlock()
	n.cfg.Log.Info("certificate renewed", "node_id", n.rec.NodeID, "not_after", chain[0].NotAfter)
	return nil
}

// SessionConn returns the live session's connection, nil when the node
// has none. The gateway answers a secret request (FetchSecret) only on
// the connection of the node's live session.
func (n *Node) SessionConn() *grpc.ClientConn {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.sessionConn
}

// session runs one session: Hello, Welcome, pending results and reports,
// then commands. It reports whether the gateway answered Hello with a
// Welcome (Run's back-off restarts then).
func (n *Node) session(ctx context.Context) (welcomed bool, err error) {
	conn, err := n.connect(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, w, err := n.hello(sctx, conn)
	if err != nil {
		return false, err
	}
	defer n.startRefresh(sctx, conn)() // trust-bundle refresh while the session lasts (refresh.go)
	rewound := n.acceptWelcome(w)
	n.applyApproverSets(w.ApproverSets)
	var allowed []string
	if len(w.AllowedKinds) > 0 {
		allowed = w.AllowedKinds
	}
	send := lockedSend(stream)
	n.mu.Lock()
	n.sessionID, n.sessionConn = w.SessionId, conn
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		n.sessionConn = nil
		n.mu.Unlock()
	}()
	n.setConnected(true)
	defer n.setConnected(false)
	n.cfg.Log.Info("session up", "node_id", n.rec.NodeID, "session_id", w.SessionId)
	// What the journal kept in memory through a disk fault (refusals,
	// results, acks) is written now if the data folder takes it again.
	if err := n.journal.Flush(); err != nil {
		n.cfg.Log.Warn("journal still not writable", "node_id", n.rec.NodeID, "err", err)
	}
	n.outbox.requeue(n.journal.Unacked())
	if err := n.sendReports(send, true); err != nil {
		return true, err
	}
	if err := n.sendHelperEvents(send, true); err != nil {
		return true, err
	}
	work := make(chan *nodev1.SignedCommand, 64)
	fetch := func(ctx context.Context, commandID, ref string) ([]byte, error) {
		return n.FetchSecret(ctx, conn, commandID, ref)
	}
	defer close(work)
	// A session's executor may outlive it (its result goes out on the next
	// session), but not Run: Run waits for every executor before it
	// returns, so no driver still runs (writing files, say) after it.
	n.executors.Add(1)
	go func() {
		defer n.executors.Done()
		n.execute(sctx, work, send, allowed, rewound, fetch)
	}()
	recvd, recvErr := recvLoop(sctx, stream)
	// The session's tunnels end with it, before its connection closes.
	defer func() { cancel(); n.tunnels.wg.Wait() }()
	tunnel := func(m *nodev1.TunnelOpen) {
		n.tunnels.wg.Add(1)
		go func() { defer n.tunnels.wg.Done(); n.openTunnel(sctx, conn, m) }()
	}
	return true, n.serve(ctx, sessionIO{send: send, tunnel: tunnel, work: work, recvd: recvd, recvErr: recvErr,
		renew: func(ctx context.Context) error { return n.Renew(ctx, conn) }})
}

// connect dials the gateway. When the certificate is due for renewal (by
// the node's clock) it renews over that connection first and dials again
// with the new certificate; a failed renewal is logged and the session
// goes on with the current one.
func (n *Node) connect(ctx context.Context) (*grpc.ClientConn, error) {
	conn, err := n.Dial()
	if err != nil {
		return nil, err
	}
	if !n.cfg.Clock.Now().After(n.renewAt()) {
		return conn, nil
	}
	if err := n.Renew(ctx, conn); err != nil {
		n.cfg.Log.Warn("renew failed", "err", err)
		return conn, nil
	}
	conn.Close()
	return n.Dial()
}

// hello opens the session stream, sends Hello and returns the stream and
// the Welcome, which must be the gateway's first message.
func (n *Node) hello(ctx context.Context, conn *grpc.ClientConn) (nodev1.Gateway_SessionClient, *nodev1.Welcome, error) {
	stream, err := nodev1.NewGatewayClient(conn).Session(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := stream.Send(&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Hello{Hello: &nodev1.Hello{
		NodeId: n.rec.NodeID, BootId: n.cfg.BootID, Version: Version, Labels: helloLabels(n.cfg.Labels, n.cfg.Driver), Inventory: n.cfg.Driver.Inventory()}}}); err != nil {
		if errors.Is(err, io.EOF) {
			// The gateway ended the stream first (a refusal): its
			// status comes with Recv, as gRPC documents for Send.
			_, err = stream.Recv()
		}
		return nil, nil, err
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, nil, err
	}
	w := first.GetWelcome()
	if w == nil {
		return nil, nil, errors.New("daemon: first message is not a Welcome")
	}
	return stream, w, nil
}

// lockedSend returns a send function that several goroutines (the
// session loop, the executor) may call at once.
func lockedSend(stream nodev1.Gateway_SessionClient) func(*nodev1.NodeMessage) error {
	var mu sync.Mutex
	return func(m *nodev1.NodeMessage) error {
		mu.Lock()
		defer mu.Unlock()
		return stream.Send(m)
	}
}

// resendTimer is a session's timer for the next result due in the
// outbox, on the node's clock (Config.Clock); it is armed only while a
// result awaits its ack.
type resendTimer struct {
	clk   clock.Clock
	t     clock.Timer
	armed bool
}

// c is the timer's channel, nil (never ready) while disarmed.
func (r *resendTimer) c() <-chan time.Time {
	if !r.armed {
		return nil
	}
	return r.t.C()
}

// set arms the timer for next (as of now), or disarms it when next is
// zero.
func (r *resendTimer) set(next, now time.Time) {
	switch {
	case next.IsZero():
		if r.armed {
			r.t.Stop()
		}
		r.armed = false
	case r.t == nil:
		r.t, r.armed = r.clk.NewTimer(next.Sub(now)), true
	default:
		r.t.Reset(next.Sub(now))
		r.armed = true
	}
}

func (r *resendTimer) stop() {
	if r.armed {
		r.t.Stop()
	}
}

// flushResults sends on this session the results due in the outbox (all
// of them at the start of a session; then each new one at once, and each
// unacknowledged one again when its wait passed) and sets rt for the next.
func (n *Node) flushResults(send func(*nodev1.NodeMessage) error, rt *resendTimer) error {
	now := n.cfg.Clock.Now()
	due, next := n.outbox.take(now)
	for _, u := range due {
		if err := n.sendUpdate(send, u); err != nil {
			return err
		}
	}
	rt.set(next, now)
	return nil
}

// recvLoop reads the stream in a goroutine until it fails (the error goes
// on the second channel) or ctx ends.
func recvLoop(ctx context.Context, stream nodev1.Gateway_SessionClient) (<-chan *nodev1.ServerMessage, <-chan error) {
	recvd := make(chan *nodev1.ServerMessage)
	recvErr := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case recvd <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	return recvd, recvErr
}

// sessionIO is what the session loop works with: the send function, the
// executor's queue, the received messages and the receive error, and the
// renewal over the session's connection.
type sessionIO struct {
	send func(*nodev1.NodeMessage) error
	// tunnel answers a TunnelOpen on the session's connection.
	tunnel  func(*nodev1.TunnelOpen)
	work    chan<- *nodev1.SignedCommand
	recvd   <-chan *nodev1.ServerMessage
	recvErr <-chan error
	renew   func(ctx context.Context) error
}

// serve is the session loop: it hands commands to the executor, applies
// acks and approver sets, sends results from the outbox (at once when a
// worker hands one over, again when one's ack is late) and sandbox
// reports as they come, and renews
// the certificate when renewAt comes by the node's clock (Config.Clock).
// A renewal ends the session (nil) so the next connects with the new
// certificate; a failed one is retried a minute later. It returns nil when
// ctx ends, and the receive error when the stream fails.
func (n *Node) serve(ctx context.Context, sio sessionIO) error {
	renew := n.cfg.Clock.NewTimer(n.renewAt().Sub(n.cfg.Clock.Now()))
	defer renew.Stop()
	rt := &resendTimer{clk: n.cfg.Clock}
	defer rt.stop()
	if err := n.flushResults(sio.send, rt); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-sio.recvErr:
			return err
		case <-n.outbox.wake:
			if err := n.flushResults(sio.send, rt); err != nil {
				return err
			}
		case <-rt.c():
			if err := n.flushResults(sio.send, rt); err != nil {
				return err
			}
		case <-n.reports.wake:
			if err := n.sendReports(sio.send, false); err != nil {
				return err
			}
		case <-n.hev.wake:
			if err := n.sendHelperEvents(sio.send, false); err != nil {
				return err
			}
		case <-renew.C():
			if err := sio.renew(ctx); err != nil {
				n.cfg.Log.Warn("renew failed", "err", err)
				renew.Reset(time.Minute)
				continue
			}
			return nil // reconnect with the new certificate
		case m := <-sio.recvd:
			if open := m.GetTunnelOpen(); open != nil {
				sio.tunnel(open)
				continue
			}
			if stop, err := n.dispatch(ctx, m, sio.work); stop {
				return err
			}
		}
	}
}

// dispatch acts on one server message. It reports stop when the session
// must end: with the ack's journaling error, or nil when ctx ended while a
// command waited for the executor.
func (n *Node) dispatch(ctx context.Context, m *nodev1.ServerMessage, work chan<- *nodev1.SignedCommand) (stop bool, err error) {
	switch msg := m.Msg.(type) {
	case *nodev1.ServerMessage_Command:
		select {
		case work <- msg.Command:
		case <-ctx.Done():
			return true, nil
		}
	case *nodev1.ServerMessage_Ack:
		if err := n.acknowledge(msg.Ack); err != nil {
			return true, err
		}
	case *nodev1.ServerMessage_SandboxAck:
		n.ackReport(msg.SandboxAck)
	case *nodev1.ServerMessage_HelperEventsAck:
		if n.hev.ack(msg.HelperEventsAck.GetSeq()) {
			select {
			case n.hev.wake <- struct{}{}:
			default:
			}
		}
	case *nodev1.ServerMessage_ApproverSets:
		n.applyApproverSets(msg.ApproverSets.GetSets())
	case *nodev1.ServerMessage_Revocations:
		n.applyRevocations(ctx, msg.Revocations)
	case *nodev1.ServerMessage_DesiredState:
		_ = n.acceptDesiredState(msg.DesiredState) // a refusal is logged; the state held stays
	case *nodev1.ServerMessage_Ping, *nodev1.ServerMessage_Welcome:
	}
	return false, nil
}

// acceptWelcome applies the Welcome's signed time statement; the
// Welcome's own server_time is unsigned and never read. A statement that
// is missing or does not verify under the command-signing roots is
// ignored (the node keeps its own clock) and logged. One more than
// MaxSkew behind the highest the node ever accepted is an old statement
// replayed: the session is marked rewound and every command on it is
// refused. Otherwise the node's time becomes at least the statement's,
// counted on from now by its own clock: a statement is a lower bound on
// the time, which only the workers can sign, so a node whose clock is
// slow refuses a command past its signed expiry all the same.
//
// How far ahead of the node's own clock a statement may be: up to MaxSkew
// it is also saved as the highest time (state.json), which later
// statements must not fall behind. More than MaxSkew ahead (the node's
// clock is slow, or the workers' fast) it sets the time of this process
// only and is not saved, so a restart is never taken for a rewind because
// of it. More than MaxClockCorrection ahead it is refused, so a broken
// clock on the control plane cannot push the node so far into the future
// that every command looks expired.
func (n *Node) acceptWelcome(w *nodev1.Welcome) (rewound bool) {
	st := w.GetTime()
	if st == nil {
		n.cfg.Log.Info("welcome carries no signed time, using own clock", "node_id", n.rec.NodeID)
		return false
	}
	at, err := n.verify.CheckTime(st)
	if err != nil {
		n.cfg.Log.Warn("welcome time ignored", "node_id", n.rec.NodeID, "err", err)
		return false
	}
	local := n.cfg.Clock.Now()
	lead := at.Sub(local)
	if lead > MaxClockCorrection {
		n.cfg.Log.Warn("signed time too far ahead, refused", "node_id", n.rec.NodeID, "statement_ms", at.UnixMilli(), "node_clock_ms", local.UnixMilli())
		return false
	}
	ms := at.UnixMilli()
	n.mu.Lock()
	defer n.mu.Unlock()
	if ms < n.highestMS-MaxSkew.Milliseconds() {
		n.cfg.Log.Warn("welcome time rewound", "node_id", n.rec.NodeID, "statement_ms", ms, "highest_ms", n.highestMS)
		return true
	}
	if n.timeAt.IsZero() || at.After(time.UnixMilli(n.timeMS).Add(local.Sub(n.timeAt))) {
		n.timeMS, n.timeAt = ms, local
	}
	if lead > MaxSkew {
		n.cfg.Log.Warn("node clock behind signed time, using signed time, not saved", "node_id", n.rec.NodeID, "behind_ms", lead.Milliseconds())
		return false
	}
	if ms > n.highestMS {
		n.highestMS = ms
		if err := writeJSON(n.cfg.DataDir, stateFile, state{HighestServerTimeMS: n.highestMS}); err != nil {
			n.cfg.Log.Error("persist server time", "err", err)
		}
	}
	return false
}

// signedNow is the lower bound on the time that signed statements give
// (the one this process accepted, counted on by the node's own clock, and
// the highest ever saved), zero when there is none.
func (n *Node) signedNow() time.Time {
	local := n.cfg.Clock.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	var t time.Time
	if !n.timeAt.IsZero() {
		t = time.UnixMilli(n.timeMS).Add(local.Sub(n.timeAt))
	}
	if n.highestMS > 0 {
		if h := time.UnixMilli(n.highestMS); h.After(t) {
			t = h
		}
	}
	return t
}

// clockAhead reports whether a body Check refused as expired is expired
// only because the node's own clock is ahead: its lifetime is within
// bounds, the node's clock is more than MaxSkew ahead of the signed time
// it holds, and by that signed time the body has not expired. A signed
// time is only a lower bound (it may be a little old), so a clock within
// MaxSkew of it is not called ahead.
func (n *Node) clockAhead(body *nodev1.CommandBody) bool {
	if body.ExpiresAtMs-body.IssuedAtMs > MaxLifetime.Milliseconds() {
		return false
	}
	s := n.signedNow()
	return !s.IsZero() && n.cfg.Clock.Now().Sub(s) > MaxSkew && s.UnixMilli() < body.ExpiresAtMs
}

// acknowledge journals the gateway's ack of a command's final update, so
// the update is not sent again after a reconnect or restart. The gateway
// acks every update it records, a "running" one too, with the state the
// command then has; only an ack naming a final state (succeeded, failed,
// cancelled) says the final update needs no resending. Journaling the ack
// of a running update would mark the command acknowledged before its
// result was sent, and a result lost with the session would then never be
// sent again.
//
// An ack the journal cannot write is kept in memory and logged, and the
// session goes on: acks are not fsynced anyway, and one lost only makes
// the node send that result again after a restart (journal's package
// comment). Ending the session instead would, on a read-only or full data
// folder, end every session at its first ack.
func (n *Node) acknowledge(a *nodev1.UpdateAck) error {
	if wire.State(a.GetState()).Terminal() {
		n.outbox.ack(a.GetCommandId())
		if err := n.journal.Ack(a.GetCommandId()); err != nil {
			if !errors.Is(err, journal.ErrNotDurable) {
				return err
			}
			n.cfg.Log.Warn("ack not journaled, data folder not writable", "command_id", a.GetCommandId(), "err", err)
		}
	}
	return nil
}

func (n *Node) sendUpdate(send func(*nodev1.NodeMessage) error, raw []byte) error {
	var u nodev1.CommandUpdate
	if err := proto.Unmarshal(raw, &u); err != nil {
		return fmt.Errorf("daemon: journaled update: %w", err)
	}
	return send(&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Update{Update: &u}})
}

// execute verifies and runs the commands of work in lanes (lanes.go):
// sandbox commands in one lane per sandbox id, every other command in one
// serial lane. A lane runs its commands one at a time in arrival order;
// different lanes run concurrently (at most MaxSandboxLanes sandbox lanes
// at once), so a long sandbox.exec delays only later commands for its own
// sandbox. The lane is chosen from the unverified body for scheduling
// only: handle verifies each command in full, whatever its lane. execute
// returns once work is closed and every lane has finished.
//
// Everything handle reaches is safe for concurrent commands: the journal
// (its Begin and Refuse check and journal an id in one step), the outbox,
// the verifier's caches and the node's own state (under their mutexes),
// the send function (lockedSend), and each command's own running timer,
// context and secret fetcher.
func (n *Node) execute(ctx context.Context, work <-chan *nodev1.SignedCommand, send func(*nodev1.NodeMessage) error, allowed []string, rewound bool,
	fetch func(ctx context.Context, commandID, ref string) ([]byte, error)) {
	l := newLanes(func(c *nodev1.SignedCommand) {
		id := c.Id
		cctx := driver.WithSecrets(ctx, func(ctx context.Context, ref string) ([]byte, error) { return fetch(ctx, id, ref) })
		if err := n.handle(cctx, c, send, allowed, rewound); err != nil {
			n.cfg.Log.Error("handle command", "command_id", id, "err", err)
		}
	})
	for c := range work {
		l.submit(laneKey(c), c)
	}
	l.wait()
}

// handle verifies one command and either refuses it or runs it. A
// message whose signature does not verify over a body naming its id is
// refused without a trace under that id (logged and counted in Refusals
// only); an authenticated command that is refused gets a "cancelled"
// update with the reason, journaled as done. For a command that runs,
// handle journals "start" (fsynced) before the driver starts, runs the
// driver, journals "done" with the signed final update and hands it to
// the outbox, which the live session sends (see outbox). The "running"
// update is sent only if the driver has not returned within
// Config.RunningAfter (at once, before the driver starts, when that is
// negative), so a quick command costs one signed update, not two; it is
// sent before the final update is handed over, so it never follows it.
// The driver gets ctx and handle waits for it to return, also when ctx
// ends (it is then not reported running).
//
// The replay check and journaling the start (or the refusal) are one step
// (journal.Begin, journal.Refuse): of two copies of one command that reach
// two workers at once, both may pass Check's replay test, but only one
// journals the id; the other is answered as a replay.
func (n *Node) handle(ctx context.Context, c *nodev1.SignedCommand, send func(*nodev1.NodeMessage) error, allowed []string, rewound bool) error {
	if len(c.Id) > 64 {
		return errors.New("command id too long")
	}
	body, reason := n.verify.Check(c, n.now(), allowed, n.seen)
	if !authenticated(body, reason) {
		// Nobody signed this id: it is only logged and counted. Journaling
		// it, or signing a refusal under it, would let anyone who knows a
		// real command's id have that command refused as a replay, or make
		// the node contradict a result it already signed.
		n.cfg.Log.Warn("unauthenticated command refused", "command_id", c.Id, "reason", reason)
		n.countRefusal(reason)
		return nil
	}
	if rewound && reason != ReasonReplayed {
		reason = ReasonClockRewound
	}
	if reason == ReasonExpired && n.clockAhead(body) {
		reason = ReasonClockAhead
	}
	expires := n.now().Add(MaxLifetime)
	if body.ExpiresAtMs > 0 && reason != ReasonExpired && reason != ReasonClockAhead {
		expires = time.UnixMilli(body.ExpiresAtMs)
	}
	switch reason {
	case "":
		// The driver may hand the verified command on (to the root
		// helper, which checks it again itself).
		signed, err := proto.Marshal(c)
		if err != nil {
			return fmt.Errorf("daemon: marshal verified command: %w", err)
		}
		return n.runCommand(driver.WithCommand(ctx, signed), c.Id, body, expires, send)
	case ReasonReplayed:
		n.answerReplay(c.Id)
		return nil
	}
	return n.refuse(c.Id, body, reason, expires, send)
}

// refuse signs a "cancelled" update with reason for an authenticated
// command, journals it (journal.Refuse) and hands it to the outbox. A
// refusal the journal cannot write (the data folder full or read-only) is
// kept in memory by the journal, so the id stays seen in this process and
// no copy of the command runs, and it is sent all the same: the control
// plane records the reason, and the journal writes the refusal at its
// next write that succeeds (before any later command's start).
func (n *Node) refuse(id string, body *nodev1.CommandBody, reason string, expires time.Time, send func(*nodev1.NodeMessage) error) error {
	upd, err := n.signUpdate(boundTo(&nodev1.UpdateBody{CommandId: id, State: string(wire.StateCancelled), Reason: reason}, body))
	if err != nil {
		return err
	}
	fresh, err := n.journal.Refuse(id, expires, upd)
	switch {
	case errors.Is(err, journal.ErrNotDurable):
		n.cfg.Log.Warn("refusal not journaled, data folder not writable", "command_id", id, "reason", reason, "err", err)
	case err != nil:
		return err
	}
	if !fresh {
		// Another copy got here first: what the node did with it stands.
		n.answerReplay(id)
		return nil
	}
	n.cfg.Log.Warn("command refused", "command_id", id, "reason", reason)
	n.countRefusal(reason)
	n.outbox.put(id, upd)
	return nil
}

// answerReplay answers a copy of a command this node already has. It is
// not run and not reported again as something else: the node hands the
// final update it journaled the first time to the outbox (a replayed copy
// can change nothing), which sends it until the control plane acknowledges
// it, as any result (sent once, an answer the gateway could not record
// was lost and the command stayed "sent"); or nothing while the first
// copy still runs here (its own result follows).
func (n *Node) answerReplay(id string) {
	n.cfg.Log.Warn("command refused", "command_id", id, "reason", ReasonReplayed)
	n.countRefusal(ReasonReplayed)
	if upd, ok := n.journal.Final(id); ok {
		n.outbox.put(id, upd)
	}
}

// runCommand journals the start of a verified command (unless another
// copy of it was journaled first: then it answers as to a replay), runs
// it, journals its signed final update and hands that to the outbox.
//
// A command the node cannot journal never runs: with less than
// Config.MinFreeBytes free in the data folder, or when the start entry
// cannot be written, it is refused with the reason naming the fault
// (data-dir-full, data-dir-read-only, journal-unwritable).
func (n *Node) runCommand(ctx context.Context, id string, body *nodev1.CommandBody, expires time.Time, send func(*nodev1.NodeMessage) error) error {
	if n.lowOnSpace() {
		return n.refuse(id, body, ReasonDataDirFull, expires, send)
	}
	sum := sha256.Sum256(body.Payload)
	fresh, err := n.journal.Begin(id, expires, body.Kind, sum[:])
	if err != nil {
		n.cfg.Log.Error("command not journaled, refused", "command_id", id, "err", err)
		return n.refuse(id, body, journalFault(err), expires, send)
	}
	if !fresh {
		n.answerReplay(id)
		return nil
	}
	result, runErr := n.run(ctx, id, body, send)
	ub := boundTo(&nodev1.UpdateBody{CommandId: id, State: string(wire.StateSucceeded), Result: result}, body)
	if runErr != nil {
		ub.State, ub.Reason, ub.Result = string(wire.StateFailed), runErr.Error(), nil
	}
	upd, err := n.signUpdate(ub)
	if err != nil {
		return err
	}
	if err := n.journal.Done(id, expires, upd); err != nil {
		if !errors.Is(err, journal.ErrNotDurable) {
			return err
		}
		// The command ran: its result is kept in memory and sent rather
		// than lost. After a crash before the journal takes it, the node
		// reports the command interrupted, which the control plane ignores
		// once it holds this result.
		n.cfg.Log.Error("result not journaled, data folder not writable", "command_id", id, "err", err)
	}
	n.outbox.put(id, upd)
	return nil
}

// authenticated reports whether Check's verdict rests on a signature
// that verified over a body naming the message's id: only then may the
// node journal the id or sign an update under it.
func authenticated(body *nodev1.CommandBody, reason string) bool {
	return body != nil && reason != ReasonIDMismatch
}

// countRefusal counts a refusal by reason (see Refusals).
func (n *Node) countRefusal(reason string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.refusals == nil {
		n.refusals = map[string]int{}
	}
	n.refusals[reason]++
}

// run runs the driver for a verified, journaled command and returns its
// result, reporting the command "running" if the driver is still at work
// after Config.RunningAfter (see handle). It always waits for the driver.
func (n *Node) run(ctx context.Context, id string, body *nodev1.CommandBody, send func(*nodev1.NodeMessage) error) ([]byte, error) {
	if n.cfg.RunningAfter < 0 {
		n.reportRunning(id, body, send)
		return n.cfg.Driver.Run(ctx, body.Kind, body.Payload)
	}
	type outcome struct {
		result []byte
		err    error
	}
	done := make(chan outcome, 1)
	go func() {
		r, err := n.cfg.Driver.Run(ctx, body.Kind, body.Payload)
		done <- outcome{r, err}
	}()
	// The delay runs on the node's clock (Config.Clock), as the session's
	// renewal timer does, so a test moves it with a fake clock.
	t := n.cfg.Clock.NewTimer(n.cfg.RunningAfter)
	defer t.Stop()
	var o outcome
	select {
	case o = <-done:
	case <-t.C():
		n.reportRunning(id, body, send)
		o = <-done
	case <-ctx.Done():
		// The session is ending and the driver sees it through ctx: no
		// running report, but the result is still journaled.
		o = <-done
	}
	return o.result, o.err
}

// reportRunning signs and sends a "running" update for id. It is advisory
// (the final update is what counts), so a failure is only logged.
func (n *Node) reportRunning(id string, body *nodev1.CommandBody, send func(*nodev1.NodeMessage) error) {
	running, err := n.signUpdate(boundTo(&nodev1.UpdateBody{CommandId: id, State: string(wire.StateRunning)}, body))
	if err != nil {
		n.cfg.Log.Warn("sign running update", "command_id", id, "err", err)
		return
	}
	_ = n.sendUpdate(send, running)
}

// Connect dials the gateway with this identity, renewing the certificate
// first when it is due. A bastion's stream (internal/bastion/agent) uses
// it; a node's own session does the same inside Run.
func (n *Node) Connect(ctx context.Context) (*grpc.ClientConn, error) { return n.connect(ctx) }
