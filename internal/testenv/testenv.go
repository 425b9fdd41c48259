// Package testenv starts a real control plane (api, gateway, workers) on
// loopback with a fresh PKI and real mutual TLS, plus real bcd node agents
// on the sim driver, for integration tests. Waiting is done on events (bus
// pokes, session callbacks), never by sleeping.
package testenv

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/api"
	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/daemon/sandbox"
	"github.com/bettercompute/bettercompute/internal/daemon/sshaccess"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/quorum/approverkeys"
	"github.com/bettercompute/bettercompute/internal/quorum/quorumwire"
	"github.com/bettercompute/bettercompute/internal/server"
	"github.com/bettercompute/bettercompute/internal/store"
)

// WaitTimeout bounds every wait; a wait that times out fails the test.
const WaitTimeout = 20 * time.Second

// shutdownGrace is the test processes' server.Options.ShutdownGrace: a
// node session is a stream that lasts until the listener stops, so a
// process closed with nodes still connected waits the whole grace; tests
// close many.
const shutdownGrace = 250 * time.Millisecond

// Options configure an environment.
type Options struct {
	Nodes int         // sim nodes to join and connect (role node)
	Clock clock.Clock // default: the real clock
	// NodeCertLifetime for issued node certificates (default 24h).
	NodeCertLifetime time.Duration
	// Tune, when set, adjusts the control plane's options before start.
	Tune func(*server.Options)
	// LogTo, when set, receives every log line of the control plane and
	// the nodes (tests that check nothing secret is logged).
	LogTo io.Writer
	// Approvers and Threshold: approver keys made in DIR/approvers and
	// pinned before any node joins (default 3 and 2, as in dev).
	Approvers, Threshold int
	// SandboxRuntime, when set (sim, runc, runsc, or a comma-separated
	// list such as "runc,runsc"), makes every node a sandbox host on that
	// runtime, or on each listed side by side, sharing the control plane's
	// image store.
	SandboxRuntime string
	// SandboxEgress wires network egress into every OCI sandbox host (the
	// machine's egress firewall table, a proxy listener per egress
	// sandbox); it needs root, iproute2 and nftables.
	SandboxEgress bool
	// NodeTune, when set, adjusts every node's configuration before it
	// opens (its tunnel allow list, say), before OpenNodeWith's own tune.
	NodeTune func(*daemon.Config)
	// SSHDRoot, when set, is where each node writes its break-glass sshd
	// files (SSHDRoot/<node folder name>), such as a folder sshd's
	// StrictModes accepts; default: the node's data folder's "sshd".
	SSHDRoot string
}

// Env is a running control plane with its nodes.
type Env struct {
	CP       *server.ControlPlane
	Client   *client.Client
	AdminKey string
	// apiTLS is set when Tune turned the API's TLS on (APIPlainHTTP false).
	apiTLS bool
	Bundle *pki.Bundle
	KEK    pki.KEK
	Dir    string
	Clock  clock.Clock
	Log    *slog.Logger
	Nodes  []*Node
	// ApproverDir holds approver-N.key and .pub; ApproverKeys are those
	// private keys in order (held by the test, never by the control plane).
	ApproverDir  string
	ApproverKeys []ed25519.PrivateKey

	sandboxRuntime, imageStore string
	nodeTune                   func(*daemon.Config)
	sandboxEgress              bool
	sshdRoot                   string
	// opts are the control plane's options, for Restart.
	opts server.Options
}

// Node is a bcd agent joined to the environment.
type Node struct {
	*daemon.Node
	Dir string
	Sim *driver.Sim
	// Sandbox is the node's sandbox host (nil unless SandboxRuntime).
	Sandbox *sandbox.Host
	// SSH is the node's ssh.access driver; SSH.Dir holds its sshd files.
	SSH *sshaccess.Driver

	mu      sync.Mutex
	state   chan bool
	sets    chan ApproverSetEvent
	refresh chan error
	cancel  context.CancelFunc
	done    chan struct{}
	running bool
}

// Logger returns a logger that writes to the test log only when
// BC_TEST_LOG=1, so failures stay readable.
func Logger(t testing.TB) *slog.Logger {
	if os.Getenv("BC_TEST_LOG") == "1" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// Start starts a control plane on db and joins o.Nodes sim nodes.
func Start(t testing.TB, db *store.DB, o Options) *Env {
	t.Helper()
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	dir := t.TempDir()
	kek, err := pki.CreateKEK(filepath.Join(dir, "kek"))
	if err != nil {
		t.Fatalf("kek: %v", err)
	}
	// The PKI is made as if two days ago, as a real deployment's CAs are
	// older than the commands they certify.
	if _, err := pki.Init(filepath.Join(dir, "pki"), "test.bc.local", kek, clock.NewFake(o.Clock.Now().Add(-48*time.Hour))); err != nil {
		t.Fatalf("pki init: %v", err)
	}
	if o.Approvers == 0 {
		o.Approvers, o.Threshold = 3, 2
	}
	approverDir := filepath.Join(dir, "approvers")
	pubs, err := approverkeys.Generate(approverDir, o.Approvers)
	if err != nil {
		t.Fatalf("approver keys: %v", err)
	}
	b, err := pki.PinApprovers(filepath.Join(dir, "pki"), pubs, o.Threshold)
	if err != nil {
		t.Fatalf("pin approvers: %v", err)
	}
	var approverKeys []ed25519.PrivateKey
	for i := range pubs {
		k, err := approverkeys.LoadPrivate(filepath.Join(approverDir, fmt.Sprintf("approver-%d.key", i+1)))
		if err != nil {
			t.Fatal(err)
		}
		approverKeys = append(approverKeys, k)
	}
	log := Logger(t)
	if o.LogTo != nil {
		log = slog.New(slog.NewTextHandler(o.LogTo, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	// The api serves the internal channel, so that gateway-only processes
	// (StartGateway) can relay to it.
	so := server.Options{DB: db, Bundle: b, KEK: kek, Clock: o.Clock, Log: log,
		RevocationPoll: 200 * time.Millisecond, NodeCertLifetime: o.NodeCertLifetime, InternalListen: "127.0.0.1:0", ShutdownGrace: shutdownGrace,
		// Tests call the API over plain HTTP on loopback, which serve allows
		// only when asked; TLS is tested in internal/server and internal/cli.
		APIListen: "127.0.0.1:0", APIPlainHTTP: true}
	// Tests make many calls quickly; rate limits are tested on their own.
	so.RateLimits = api.RateLimits{ReadPerSecond: 1e6, ReadBurst: 1e6, MutatePerSecond: 1e6, MutateBurst: 1e6}
	so.TenantMutates = 1 << 16
	imageStore := ""
	if o.SandboxRuntime != "" {
		imageStore = sandboxImageStore(t, dir)
		// Sandboxes come with the preview role (sandboxes.preview's URLs).
		so.SandboxImages, so.Roles = imageStore, []string{server.RoleAPI, server.RoleGateway, server.RoleWorkers, server.RolePreview}
	}
	if o.Tune != nil {
		o.Tune(&so)
	}
	cp, err := server.Start(context.Background(), so)
	if err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	e := &Env{CP: cp, Bundle: b, KEK: kek, Dir: dir, Clock: o.Clock, Log: log, ApproverDir: approverDir, ApproverKeys: approverKeys,
		sandboxRuntime: o.SandboxRuntime, sandboxEgress: o.SandboxEgress, imageStore: imageStore, opts: so, nodeTune: o.NodeTune, sshdRoot: o.SSHDRoot}
	t.Cleanup(e.Close)
	_, key, err := cp.APIKeys.Create(context.Background(), audit.Entry{TenantID: iam.RootTenant, Actor: "testenv"}, iam.RootTenant, "admin", "admin", 0)
	if err != nil {
		t.Fatalf("admin key: %v", err)
	}
	e.AdminKey = key
	e.apiTLS = !so.APIPlainHTTP
	e.Client = e.NewClient(t, key)
	for i := 0; i < o.Nodes; i++ {
		n := e.Join(t, pki.RoleNode, "")
		n.Start(t)
		n.WaitConnected(t)
		e.Nodes = append(e.Nodes, n)
	}
	return e
}

// PKIDir is the directory of the environment's PKI bundle, which the
// pki.Rotate* steps change.
func (e *Env) PKIDir() string { return filepath.Join(e.Dir, "pki") }

// Restart stops the control plane and starts it again on the same
// database, listen addresses and key-encryption key, with the PKI bundle
// as it now is in PKIDir: a rotation step takes effect in a control plane
// process when it restarts, as in production. Nodes reconnect on their
// own; e.Bundle is the reloaded bundle.
func (e *Env) Restart(t testing.TB) {
	t.Helper()
	e.CP.Close()
	b, err := pki.Load(e.PKIDir())
	if err != nil {
		t.Fatalf("reload pki: %v", err)
	}
	o := e.opts
	o.Bundle, o.APIListen, o.GatewayListen, o.InternalListen = b, e.CP.APIAddr, e.CP.GatewayAddr, e.CP.InternalAddr
	o.PreviewListen = e.CP.PreviewAddr
	cp, err := server.Start(context.Background(), o)
	if err != nil {
		t.Fatalf("restart control plane: %v", err)
	}
	e.CP, e.Bundle = cp, b
}

// StartGateway starts a second control plane process with only the
// gateway role on the same database, as an operator runs one: from the
// files `pki issue-gateway` writes (the bundle's public half, the
// gateway's certificate and key), without the key-encryption key, relaying
// Join, Renew and Secret to this environment's api over the internal
// channel. It shares nothing in memory with the first (no bus), as another
// machine's gateway would not.
func (e *Env) StartGateway(t testing.TB) *server.ControlPlane {
	t.Helper()
	return e.StartGatewayWith(t, nil)
}

// GatewayFiles issues a gateway certificate as `pki issue-gateway` does and
// writes the gateway's files into a fresh directory, which it returns.
func (e *Env) GatewayFiles(t testing.TB) string {
	t.Helper()
	internalKey, err := e.Bundle.InternalCAKey(e.KEK)
	if err != nil {
		t.Fatalf("internal CA key: %v", err)
	}
	cert, err := pki.IssueGatewayCert(e.Bundle.InternalCA, internalKey, e.Bundle.TrustDomain, []string{"localhost"},
		[]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, 7*24*time.Hour, e.Clock.Now())
	if err != nil {
		t.Fatalf("gateway certificate: %v", err)
	}
	dir := filepath.Join(t.TempDir(), "gateway")
	if err := e.Bundle.WriteGatewayFiles(dir, cert); err != nil {
		t.Fatalf("gateway files: %v", err)
	}
	return dir
}

// GatewayOnlyOptions returns the options of a gateway-only process built
// from dir (GatewayFiles): the public bundle, the gateway certificate, the
// api's internal channel, and no key-encryption key.
func (e *Env) GatewayOnlyOptions(t testing.TB, dir string) server.Options {
	t.Helper()
	pub, err := pki.LoadPublic(dir)
	if err != nil {
		t.Fatalf("load public bundle: %v", err)
	}
	cert, err := pki.LoadGatewayCert(filepath.Join(dir, pki.GatewayCertFile), filepath.Join(dir, pki.GatewayKeyFile))
	if err != nil {
		t.Fatalf("load gateway certificate: %v", err)
	}
	return server.Options{DB: e.CP.DB, Bundle: pub, GatewayCert: &cert, Control: e.CP.InternalAddr, Clock: e.Clock, Log: e.Log,
		Roles: []string{server.RoleGateway}, RevocationPoll: time.Second, ShutdownGrace: shutdownGrace}
}

// StartGatewayWith is StartGateway with tune applied to its options.
func (e *Env) StartGatewayWith(t testing.TB, tune func(*server.Options)) *server.ControlPlane {
	t.Helper()
	o := e.GatewayOnlyOptions(t, e.GatewayFiles(t))
	if tune != nil {
		tune(&o)
	}
	cp, err := server.Start(context.Background(), o)
	if err != nil {
		t.Fatalf("start second gateway: %v", err)
	}
	t.Cleanup(cp.Close)
	return cp
}

// TenantAdmin makes a tenant under root with an identity bound to the
// built-in admin role, and returns the tenant id and a client with that
// identity's key.
func (e *Env) TenantAdmin(t testing.TB, name string) (string, *client.Client) {
	t.Helper()
	ctx := context.Background()
	tn, err := e.Client.CreateTenant(ctx, "", name)
	if err != nil {
		t.Fatalf("create tenant: %v", err)
	}
	return tn.ID, e.IdentityClient(t, tn.ID, name+"-admin", "admin")
}

// IdentityClient makes an identity in tenant bound to role and returns a
// client with a key for it.
func (e *Env) IdentityClient(t testing.TB, tenant, name, role string) *client.Client {
	t.Helper()
	ctx := context.Background()
	id, err := e.Client.CreateIdentity(ctx, tenant, name, "person")
	if err != nil {
		t.Fatalf("create identity: %v", err)
	}
	if role != "" {
		if err := e.Client.Bind(ctx, tenant, id.ID, role); err != nil {
			t.Fatalf("bind: %v", err)
		}
	}
	k, err := e.Client.CreateAPIKey(ctx, tenant, id.ID, name, 0)
	if err != nil {
		t.Fatalf("create key: %v", err)
	}
	return e.NewClient(t, k.Key)
}

// Close stops the nodes and the control plane.
func (e *Env) Close() {
	for _, n := range e.Nodes {
		n.Stop()
	}
	e.CP.Close()
}

// Join makes a token for role and joins a new sim node with the real
// bcd join path; the node is not started.
func (e *Env) Join(t testing.TB, role, name string) *Node {
	t.Helper()
	return e.JoinIn(t, "", role, name)
}

// JoinIn is Join with the node's data folder at dir (a fresh folder under
// the environment's when dir is empty), such as a filesystem the test
// mounted to fill or make read-only.
func (e *Env) JoinIn(t testing.TB, dir, role, name string) *Node {
	t.Helper()
	ctx := context.Background()
	tok, err := e.CP.Nodes.CreateJoinToken(ctx, audit.Entry{TenantID: iam.RootTenant, Actor: "testenv"}, role, name, time.Hour)
	if err != nil {
		t.Fatalf("join token: %v", err)
	}
	if dir == "" {
		dir = filepath.Join(e.Dir, "nodes", tok.ID)
	}
	if _, err := daemon.Join(ctx, daemon.JoinOptions{DataDir: dir, Gateway: e.CP.GatewayAddr, Token: tok.Token, Name: name}); err != nil {
		t.Fatalf("join: %v", err)
	}
	return e.OpenNode(t, dir, "")
}

// OpenNode opens the node agent in dir (a fresh boot id unless bootID is
// set), without starting it.
func (e *Env) OpenNode(t testing.TB, dir, bootID string) *Node {
	t.Helper()
	return e.OpenNodeAt(t, dir, bootID, e.CP.GatewayAddr)
}

// OpenNodeAt is OpenNode against the gateway at addr.
func (e *Env) OpenNodeAt(t testing.TB, dir, bootID, addr string) *Node {
	t.Helper()
	return e.openNode(t, dir, bootID, addr, nil)
}

// OpenNodeAtWith is OpenNodeAt with tune applied to the node's
// configuration before it opens.
func (e *Env) OpenNodeAtWith(t testing.TB, dir, bootID, addr string, tune func(*daemon.Config)) *Node {
	t.Helper()
	return e.openNode(t, dir, bootID, addr, tune)
}

// OpenNodeWith is OpenNode with tune applied to the node's configuration
// before it opens (a node clock of its own, say).
func (e *Env) OpenNodeWith(t testing.TB, dir, bootID string, tune func(*daemon.Config)) *Node {
	t.Helper()
	return e.openNode(t, dir, bootID, e.CP.GatewayAddr, tune)
}

func (e *Env) openNode(t testing.TB, dir, bootID, addr string, tune func(*daemon.Config)) *Node {
	t.Helper()
	sim := driver.NewSim(filepath.Base(dir))
	n := &Node{Dir: dir, Sim: sim, state: make(chan bool, 64), sets: make(chan ApproverSetEvent, 64), refresh: make(chan error, 64)}
	sshDir := filepath.Join(dir, "sshd")
	if e.sshdRoot != "" {
		sshDir = filepath.Join(e.sshdRoot, filepath.Base(dir))
	}
	n.SSH = &sshaccess.Driver{Driver: e.nodeDriver(t, n), Dir: sshDir, StateDir: dir}
	cfg := daemon.Config{DataDir: dir, Gateway: addr, Driver: n.SSH, Clock: e.Clock, Log: e.Log, BootID: bootID,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}
	if e.nodeTune != nil {
		e.nodeTune(&cfg)
	}
	if tune != nil {
		tune(&cfg)
	}
	d, err := daemon.Open(cfg)
	if err != nil {
		t.Fatalf("open node: %v", err)
	}
	n.SSH.SetNodeID(d.NodeID())
	d.OnState(func(c bool) { n.state <- c })
	d.OnApproverSet(func(g uint64, reason string) {
		select {
		case n.sets <- ApproverSetEvent{Generation: g, Reason: reason}:
		default:
		}
	})
	d.OnRefresh(func(err error) {
		select {
		case n.refresh <- err:
		default:
		}
	})
	n.Node = d
	return n
}

// WaitRefresh waits for the node's next trust-bundle refresh that
// accepted or refused an offered bundle, and returns its outcome (nil:
// accepted). Refreshes that found the bundle unchanged
// (pki.ErrBundleNotNewer) or could not fetch it are skipped.
func (n *Node) WaitRefresh(t testing.TB) error {
	t.Helper()
	for {
		err := n.NextRefresh(t)
		if errors.Is(err, pki.ErrBundleNotNewer) || errors.Is(err, daemon.ErrRefreshFetch) {
			continue
		}
		return err
	}
}

// NextRefresh waits for the outcome of the node's next trust-bundle
// refresh, whatever it is.
func (n *Node) NextRefresh(t testing.TB) error {
	t.Helper()
	select {
	case err := <-n.refresh:
		return err
	case <-time.After(WaitTimeout):
		t.Fatalf("node %s: no trust-bundle refresh within %v", n.NodeID(), WaitTimeout)
		return nil
	}
}

// DrainRefreshes forgets the refresh outcomes seen so far, so that
// WaitRefresh waits for a later one.
func (n *Node) DrainRefreshes() {
	for {
		select {
		case <-n.refresh:
		default:
			return
		}
	}
}

// Start runs the node agent in the background until Stop.
func (n *Node) Start(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	n.mu.Lock()
	n.cancel, n.done, n.running = cancel, make(chan struct{}), true
	done := n.done
	n.mu.Unlock()
	go func() {
		defer close(done)
		_ = n.Run(ctx)
	}()
	t.Cleanup(n.Stop)
}

// Stop stops the agent and waits for it; it is idempotent.
func (n *Node) Stop() {
	n.mu.Lock()
	if !n.running {
		n.mu.Unlock()
		return
	}
	n.running = false
	cancel, done := n.cancel, n.done
	n.mu.Unlock()
	cancel()
	<-done
	_ = n.Close()
}

// WaitConnected waits for the node's session to come up.
func (n *Node) WaitConnected(t testing.TB) { n.waitState(t, true, WaitTimeout) }

// WaitDisconnected waits for the node's session to go down.
func (n *Node) WaitDisconnected(t testing.TB) { n.waitState(t, false, WaitTimeout) }

// WaitDisconnectedWithin fails the test unless the session goes down
// within d (a bound the product promises, such as revocation's 5 s).
func (n *Node) WaitDisconnectedWithin(t testing.TB, d time.Duration) { n.waitState(t, false, d) }

func (n *Node) waitState(t testing.TB, want bool, within time.Duration) {
	t.Helper()
	timeout := time.After(within)
	for {
		if n.Connected() == want {
			// Drain stale notifications so the next wait sees new ones.
			for {
				select {
				case <-n.state:
					continue
				default:
				}
				break
			}
			if n.Connected() == want {
				return
			}
		}
		select {
		case <-n.state:
		case <-timeout:
			t.Fatalf("node %s: session connected=%v not reached within %v", n.NodeID(), want, within)
		}
	}
}

// ApproverSetEvent is a node's decision on one approver-set change.
type ApproverSetEvent struct {
	Generation uint64
	Reason     string // "" when accepted
}

// WaitApproverSet waits for the node's next decision on an approver-set
// change.
func (n *Node) WaitApproverSet(t testing.TB) ApproverSetEvent {
	t.Helper()
	select {
	case ev := <-n.sets:
		return ev
	case <-time.After(WaitTimeout):
		t.Fatalf("node %s: no approver-set decision within %v", n.NodeID(), WaitTimeout)
		return ApproverSetEvent{}
	}
}

// Approve signs batch id's (deployment, id, root, expiry) with each key, as
// `batch approve` does off the control plane, and submits the signatures
// through the API. It returns the batch after the last approval.
func (e *Env) Approve(t testing.TB, id string, keys ...ed25519.PrivateKey) client.Batch {
	t.Helper()
	ctx := context.Background()
	b, err := e.Client.Batch(ctx, id)
	if err != nil {
		t.Fatalf("read batch: %v", err)
	}
	root, err := hex.DecodeString(b.Root)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		sig := ed25519.Sign(k, quorumwire.ApprovalMessage(b.Deployment, b.ID, root, b.ExpiresMS))
		if b, err = e.Client.ApproveBatch(ctx, id, k.Public().(ed25519.PublicKey), sig); err != nil {
			t.Fatalf("approve batch: %v", err)
		}
	}
	return b
}

// InjectBatchedCommand is InjectCommand for a row the queue treats as part
// of batchID (the approval and proof the gateway attaches come from that
// batch), whatever batch the signed body names.
func (e *Env) InjectBatchedCommand(t testing.TB, nodeID string, body *nodev1.CommandBody, sign Signer, batchID string) string {
	t.Helper()
	id := body.CommandId
	if id == "" {
		id = ids.New("c")
		body.CommandId = id
	}
	raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	sig, cert := sign(raw)
	now := e.Clock.Now().UnixMilli()
	// archtest:plays-attacker: a row written straight into the database, as
	// one holding its credentials would, for the node to judge.
	_, err = e.CP.DB.ExecContext(context.Background(), `INSERT INTO commands (id, tenant_id, node_id, kind, payload, state, created_by, created_at, updated_at, expires_at, body, signature, signer_cert, batch_id) -- archtest:plays-attacker
		VALUES ($1, $11, $2, $3, $4, 'queued', 'test', $5, $5, $6, $7, $8, $9, $10)`, id, nodeID, body.Kind, body.Payload, now, body.ExpiresAtMs, raw, sig, cert, batchID, iam.RootTenant)
	if err != nil {
		t.Fatalf("inject batched command: %v", err)
	}
	e.CP.Bus.Publish(bus.NodeTopic(nodeID))
	return id
}

// WaitCommand waits until command id is final and returns it.
func (e *Env) WaitCommand(t testing.TB, id string) commands.Command {
	t.Helper()
	poke, stop := e.CP.Bus.Subscribe(bus.CommandTopic(id))
	defer stop()
	// An update stored by a gateway in another control plane pokes that
	// process's bus, not this one's: re-read on a slow tick as well.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	timeout := time.After(WaitTimeout)
	for {
		c, err := e.CP.Commands.Get(context.Background(), iam.RootScope(), id)
		if err != nil {
			t.Fatalf("get command: %v", err)
		}
		if commands.Terminal(c.State) {
			return c
		}
		select {
		case <-poke:
		case <-tick.C:
		case <-timeout:
			t.Fatalf("command %s still %s after %v", id, c.State, WaitTimeout)
		}
	}
}

// Signer produces a (signature, signer certificate) pair for body bytes.
type Signer func(body []byte) (sig, cert []byte)

// WorkerSigner certifies a fresh worker key with the environment's real
// command-signing root, as a worker would, and signs with it.
func (e *Env) WorkerSigner(t testing.TB) Signer {
	t.Helper()
	rootKey, err := e.Bundle.CommandRootKey(e.KEK)
	if err != nil {
		t.Fatalf("command root key: %v", err)
	}
	return SignerFromRoot(t, e.Bundle.CommandRoot, rootKey, e.Bundle.TrustDomain, e.Clock.Now())
}

// SignerFromRoot certifies a fresh worker key under root and signs with it.
func SignerFromRoot(t testing.TB, root *x509.Certificate, rootKey ed25519.PrivateKey, td string, now time.Time) Signer {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := pki.IssueWorkerCert(root, rootKey, td, "wk-test", pub, 24*time.Hour, now)
	if err != nil {
		t.Fatalf("worker cert: %v", err)
	}
	return func(body []byte) ([]byte, []byte) {
		return ed25519.Sign(priv, append([]byte(wire.CommandSigContext), body...)), cert
	}
}

// InjectCommand writes a command row for nodeID exactly as given (body,
// signature, signer certificate), as a compromised database or gateway
// could, and pokes the gateway to send it. It returns the row id.
func (e *Env) InjectCommand(t testing.TB, nodeID string, body *nodev1.CommandBody, sign Signer) string {
	t.Helper()
	id := body.CommandId
	if id == "" {
		id = ids.New("c")
		body.CommandId = id
	}
	raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	var sig, cert []byte
	if sign != nil {
		sig, cert = sign(raw)
	}
	e.InsertSigned(t, id, nodeID, body.Kind, raw, sig, cert, body.ExpiresAtMs)
	return id
}

// InsertSigned inserts a queued command row with the given signed bytes
// and pokes the node's gateway.
func (e *Env) InsertSigned(t testing.TB, id, nodeID, kind string, body, sig, cert []byte, expiresMS int64) {
	t.Helper()
	now := e.Clock.Now().UnixMilli()
	if expiresMS == 0 {
		expiresMS = now + int64(10*time.Minute/time.Millisecond)
	}
	_, err := e.CP.DB.ExecContext(context.Background(), `INSERT INTO commands (id, tenant_id, node_id, kind, payload, state, created_by, created_at, updated_at, expires_at, body, signature, signer_cert) -- archtest:plays-attacker
		VALUES ($1, $10, $2, $3, $4, 'queued', 'test', $5, $5, $6, $7, $8, $9)`, id, nodeID, kind, []byte("{}"), now, expiresMS, body, sig, cert, iam.RootTenant)
	if err != nil {
		t.Fatalf("inject command: %v", err)
	}
	e.CP.Bus.Publish(bus.NodeTopic(nodeID))
}

// Body returns a well-formed command body for nodeID, issued now and
// expiring in ten minutes by the environment's clock.
func (e *Env) Body(nodeID, kind string) *nodev1.CommandBody {
	now := e.Clock.Now()
	return &nodev1.CommandBody{CommandId: ids.New("c"), NodeId: nodeID, Kind: kind, Payload: []byte("{}"),
		IssuedAtMs: now.UnixMilli(), ExpiresAtMs: now.Add(10 * time.Minute).UnixMilli(), Nonce: ids.Secret(12)}
}

// APIURL is the API's base URL: https:// when Tune turned TLS on, else
// plain http:// on loopback.
func (e *Env) APIURL() string {
	if e.apiTLS {
		return "https://" + e.CP.APIAddr
	}
	return "http://" + e.CP.APIAddr
}

// NewClient returns a client of the API with key, verifying the server
// against the bundle's API CA when the API serves TLS.
func (e *Env) NewClient(t testing.TB, key string) *client.Client {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(e.Bundle.APICAPEM())
	c, err := client.NewTLS(e.APIURL(), key, roots)
	if err != nil {
		t.Fatalf("API client: %v", err)
	}
	return c
}
