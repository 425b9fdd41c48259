// Package testenv starts a real control plane (api, gateway, workers) on
// loopback with a fresh PKI and real mutual TLS, plus real bcd node agents
// on the sim driver, for integration tests. Waiting is done on events (bus
// pokes, session callbacks), never by sleeping.
package testenv

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/server"
	"github.com/bettercompute/bettercompute/internal/store"
)

// WaitTimeout bounds every wait; a wait that times out fails the test.
const WaitTimeout = 20 * time.Second

// Options configure an environment.
type Options struct {
	Nodes int         // sim nodes to join and connect (role node)
	Clock clock.Clock // default: the real clock
	// NodeCertLifetime for issued node certificates (default 24h).
	NodeCertLifetime time.Duration
}

// Env is a running control plane with its nodes.
type Env struct {
	CP       *server.ControlPlane
	Client   *client.Client
	AdminKey string
	Bundle   *pki.Bundle
	KEK      pki.KEK
	Dir      string
	Clock    clock.Clock
	Log      *slog.Logger
	Nodes    []*Node
}

// Node is a bcd agent joined to the environment.
type Node struct {
	*daemon.Node
	Dir string
	Sim *driver.Sim

	mu      sync.Mutex
	state   chan bool
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
	b, err := pki.Init(filepath.Join(dir, "pki"), "test.bc.local", kek, o.Clock)
	if err != nil {
		t.Fatalf("pki init: %v", err)
	}
	log := Logger(t)
	cp, err := server.Start(context.Background(), server.Options{DB: db, Bundle: b, KEK: kek, Clock: o.Clock, Log: log,
		RevocationPoll: 200 * time.Millisecond, NodeCertLifetime: o.NodeCertLifetime})
	if err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	e := &Env{CP: cp, Bundle: b, KEK: kek, Dir: dir, Clock: o.Clock, Log: log}
	t.Cleanup(e.Close)
	_, key, err := cp.APIKeys.Create(context.Background(), audit.Entry{TenantID: "root", Actor: "testenv"}, "root", "admin", "admin", 0)
	if err != nil {
		t.Fatalf("admin key: %v", err)
	}
	e.AdminKey = key
	e.Client = client.New("http://"+cp.APIAddr, key)
	for i := 0; i < o.Nodes; i++ {
		n := e.Join(t, pki.RoleNode, "")
		n.Start(t)
		n.WaitConnected(t)
		e.Nodes = append(e.Nodes, n)
	}
	return e
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
	ctx := context.Background()
	tok, err := e.CP.Nodes.CreateJoinToken(ctx, audit.Entry{TenantID: "root", Actor: "testenv"}, role, name, time.Hour)
	if err != nil {
		t.Fatalf("join token: %v", err)
	}
	dir := filepath.Join(e.Dir, "nodes", tok.ID)
	if _, err := daemon.Join(ctx, daemon.JoinOptions{DataDir: dir, Gateway: e.CP.GatewayAddr, Token: tok.Token, Name: name}); err != nil {
		t.Fatalf("join: %v", err)
	}
	return e.OpenNode(t, dir, "")
}

// OpenNode opens the node agent in dir (a fresh boot id unless bootID is
// set), without starting it.
func (e *Env) OpenNode(t testing.TB, dir, bootID string) *Node {
	t.Helper()
	sim := driver.NewSim(filepath.Base(dir))
	n := &Node{Dir: dir, Sim: sim, state: make(chan bool, 64)}
	d, err := daemon.Open(daemon.Config{DataDir: dir, Gateway: e.CP.GatewayAddr, Driver: sim, Clock: e.Clock, Log: e.Log, BootID: bootID,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	if err != nil {
		t.Fatalf("open node: %v", err)
	}
	d.OnState(func(c bool) { n.state <- c })
	n.Node = d
	return n
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
func (n *Node) WaitConnected(t testing.TB) { n.waitState(t, true) }

// WaitDisconnected waits for the node's session to go down.
func (n *Node) WaitDisconnected(t testing.TB) { n.waitState(t, false) }

func (n *Node) waitState(t testing.TB, want bool) {
	t.Helper()
	timeout := time.After(WaitTimeout)
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
			t.Fatalf("node %s: session connected=%v not reached within %v", n.NodeID(), want, WaitTimeout)
		}
	}
}

// WaitCommand waits until command id is final and returns it.
func (e *Env) WaitCommand(t testing.TB, id string) commands.Command {
	t.Helper()
	poke, stop := e.CP.Bus.Subscribe(bus.CommandTopic(id))
	defer stop()
	timeout := time.After(WaitTimeout)
	for {
		c, err := e.CP.Commands.Get(context.Background(), "root", id)
		if err != nil {
			t.Fatalf("get command: %v", err)
		}
		if commands.Terminal(c.State) {
			return c
		}
		select {
		case <-poke:
		case <-timeout:
			t.Fatalf("command %s still %s after %v", id, c.State, WaitTimeout)
		}
	}
}
