package daemon_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
	"github.com/bettercompute/bettercompute/internal/tickets"
)

// rogueGateway is a compromised gateway: it holds a node's session and
// sends it whatever TunnelOpen the test gives, verifying nothing; it
// hands the test each Tunnel stream's hello.
type rogueGateway struct {
	nodev1.UnimplementedGatewayServer
	opens  chan *nodev1.TunnelOpen
	hellos chan *nodev1.TunnelHello
	up     chan struct{}
	// timeOf, when set, gives the signed time its Welcome carries.
	timeOf func() *nodev1.SignedTimeStatement
}

func (g *rogueGateway) Session(s nodev1.Gateway_SessionServer) error {
	if _, err := s.Recv(); err != nil {
		return err
	}
	w := &nodev1.Welcome{SessionId: "rogue"}
	if g.timeOf != nil {
		w.Time = g.timeOf()
	}
	if err := s.Send(&nodev1.ServerMessage{Msg: &nodev1.ServerMessage_Welcome{Welcome: w}}); err != nil {
		return err
	}
	g.up <- struct{}{}
	for {
		select {
		case o := <-g.opens:
			if err := s.Send(&nodev1.ServerMessage{Msg: &nodev1.ServerMessage_TunnelOpen{TunnelOpen: o}}); err != nil {
				return err
			}
		case <-s.Context().Done():
			return nil
		}
	}
}

func (g *rogueGateway) Tunnel(s nodev1.Gateway_TunnelServer) error {
	f, err := s.Recv()
	if err != nil {
		return err
	}
	g.hellos <- f.GetHello()
	if f.GetHello().GetRefused() != "" {
		return nil
	}
	// An accepted tunnel: say hello through it and end it.
	if err := s.Send(&nodev1.TunnelFrame{Frame: &nodev1.TunnelFrame_Data{Data: []byte("ping")}}); err != nil {
		return err
	}
	return s.Send(&nodev1.TunnelFrame{Frame: &nodev1.TunnelFrame_Eof{Eof: true}})
}

// TestNodeVerifiesTunnelTicketsItself: a gateway that verifies nothing
// (compromised) sends the node TunnelOpens; the node opens a tunnel only
// for a genuine, fresh ticket for itself, the tunnel action and a port on
// its own list, issued after it started, once; every other ticket is
// refused with its exact reason and nothing is dialled.
func TestNodeVerifiesTunnelTicketsItself(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		// The node's allowed port has a listener that records what it gets.
		port, got := recordingListener(t)
		g := &rogueGateway{opens: make(chan *nodev1.TunnelOpen), hellos: make(chan *nodev1.TunnelHello), up: make(chan struct{}, 1)}
		cfg := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{gatewayCert(t, e.Bundle, e.KEK, e.Bundle.TrustDomain)}, ClientAuth: tls.RequestClientCert}
		addr, _ := serve(t, cfg, g, false)
		joined := e.Join(t, pki.RoleNode, "")
		joined.Close()
		n := e.OpenNodeAtWith(t, joined.Dir, "", addr, func(c *daemon.Config) { c.TunnelPorts = []uint32{port} })
		n.Start(t)
		<-g.up
		self := n.NodeID()
		now := e.Clock.Now()
		body := func(mod func(*nodev1.TicketBody)) *nodev1.SignedTicket {
			b := &nodev1.TicketBody{Jti: ids.New("j"), NodeId: self, Port: port, Action: tickets.ActionNodeTunnel, TenantId: "root", Caller: "x",
				IssuedAtMs: now.Add(time.Second).UnixMilli(), ExpiresAtMs: now.Add(time.Minute).UnixMilli()}
			if mod != nil {
				mod(b)
			}
			st, err := e.CP.Signer.SignTicket(context.Background(), b)
			if err != nil {
				t.Fatal(err)
			}
			return st
		}
		askFor := func(st *nodev1.SignedTicket, sandbox string) string {
			id := ids.New("tun")
			g.opens <- &nodev1.TunnelOpen{TunnelId: id, Ticket: st, SandboxId: sandbox}
			h := <-g.hellos
			if h.GetTunnelId() != id {
				t.Fatalf("hello for %q, want %q", h.GetTunnelId(), id)
			}
			return h.GetRefused()
		}
		ask := func(st *nodev1.SignedTicket) string { return askFor(st, "") }
		good := body(nil)
		if r := ask(good); r != "" {
			t.Fatalf("genuine ticket refused: %s", r)
		}
		if s := <-got; s != "ping" {
			t.Fatalf("the port got %q", s)
		}
		forged := proto.Clone(body(nil)).(*nodev1.SignedTicket)
		forged.Signature[0] ^= 1
		_, otherKey, _ := ed25519.GenerateKey(rand.Reader)
		foreign := body(nil)
		foreign.Signature = ed25519.Sign(otherKey, append([]byte(tickets.SigContext), foreign.Body...))
		for _, c := range []struct {
			name string
			st   *nodev1.SignedTicket
			want string
		}{
			{"spent", good, string(tickets.ReasonSpent)},
			{"another node's", body(func(b *nodev1.TicketBody) { b.NodeId = "n-other" }), string(tickets.ReasonWrongNode)},
			{"a port not on the list", body(func(b *nodev1.TicketBody) { b.Port = port + 1 }), nodev1.TunnelPortNotAllowed},
			{"expired", body(func(b *nodev1.TicketBody) {
				b.IssuedAtMs, b.ExpiresAtMs = now.Add(-2*time.Minute).UnixMilli(), now.Add(-time.Minute).UnixMilli()
			}), string(tickets.ReasonExpired)},
			{"another action", body(func(b *nodev1.TicketBody) { b.Action = "compute:nodes:ssh-root" }), string(tickets.ReasonUnexpectedAction)},
			{"issued before the node started", body(func(b *nodev1.TicketBody) {
				b.IssuedAtMs, b.ExpiresAtMs = now.Add(-10*time.Second).UnixMilli(), now.Add(40*time.Second).UnixMilli()
			}), daemon.ReasonTicketBeforeStart},
			{"forged signature", forged, string(tickets.ReasonSignatureInvalid)},
			{"signed by a key the roots never certified", foreign, string(tickets.ReasonSignatureInvalid)},
			{"none", nil, string(tickets.ReasonMalformed)},
		} {
			if r := ask(c.st); r != c.want {
				t.Errorf("%s ticket: refused %q, want %q", c.name, r, c.want)
			}
		}
		// Exec tickets: the sandbox the TunnelOpen names must be the signed
		// one; this node runs no sandboxes, so a genuine one is refused
		// exec-unsupported, never run elsewhere.
		execTicket := func(sandbox string) *nodev1.SignedTicket {
			return body(func(b *nodev1.TicketBody) {
				b.Action, b.SandboxId, b.Port, b.Argv = tickets.ActionSandboxExec, sandbox, 0, []string{"sh"}
			})
		}
		for _, c := range []struct {
			name, hint string
			st         *nodev1.SignedTicket
			want       string
		}{
			{"an exec ticket for another sandbox than named", "sb-two", execTicket("sb-one"), string(tickets.ReasonWrongSandbox)},
			{"a tunnel ticket presented as an exec", "sb-one", body(nil), string(tickets.ReasonWrongPort)},
			{"an exec ticket presented as a tunnel", "", execTicket("sb-one"), nodev1.TunnelPortNotAllowed},
			{"a genuine exec on a node without sandboxes", "sb-one", execTicket("sb-one"), nodev1.ExecUnsupported},
		} {
			if r := askFor(c.st, c.hint); r != c.want {
				t.Errorf("%s: refused %q, want %q", c.name, r, c.want)
			}
		}
		select {
		case s := <-got:
			t.Fatalf("a refused ticket reached the port: %q", s)
		default:
		}
	})
}

// recordingListener listens on a loopback port, closed at the test's end,
// and hands each connection's bytes (read to EOF) to got.
func recordingListener(t *testing.T) (port uint32, got chan string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	got = make(chan string, 8)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			b, _ := io.ReadAll(c)
			got <- string(b)
			c.Close()
		}
	}()
	return uint32(lis.Addr().(*net.TCPAddr).Port), got
}

// slowClock is a node clock running by behind the control plane's.
type slowClock struct {
	clock.Clock
	by time.Duration
}

func (c slowClock) Now() time.Time { return c.Clock.Now().Add(-c.by) }

// TestSpentTicketRefusedAfterRestart: a ticket a node accepted is refused
// as spent by the next bcd process on the same data folder, also on a node
// whose clock is minutes slow (the signed time in the gateway's Welcome
// corrects it, but the process's start was taken on the slow clock, so the
// ticket-before-start check alone let the ticket through again).
func TestSpentTicketRefusedAfterRestart(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		// The node's allowed port has a listener that records what it gets.
		port, got := recordingListener(t)
		g := &rogueGateway{opens: make(chan *nodev1.TunnelOpen), hellos: make(chan *nodev1.TunnelHello), up: make(chan struct{}, 1),
			timeOf: func() *nodev1.SignedTimeStatement {
				st, err := e.CP.Signer.SignTime(context.Background())
				if err != nil {
					t.Error(err)
				}
				return st
			}}
		cfg := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{gatewayCert(t, e.Bundle, e.KEK, e.Bundle.TrustDomain)}, ClientAuth: tls.RequestClientCert}
		addr, _ := serve(t, cfg, g, false)
		joined := e.Join(t, pki.RoleNode, "")
		joined.Close()
		slow := func(c *daemon.Config) {
			c.TunnelPorts, c.Clock = []uint32{port}, slowClock{Clock: e.Clock, by: 3 * time.Minute}
		}
		n := e.OpenNodeAtWith(t, joined.Dir, "", addr, slow)
		n.Start(t)
		<-g.up
		now := e.Clock.Now()
		st, err := e.CP.Signer.SignTicket(context.Background(), &nodev1.TicketBody{Jti: ids.New("j"), NodeId: n.NodeID(), Port: port,
			Action: tickets.ActionNodeTunnel, TenantId: "root", Caller: "x", IssuedAtMs: now.UnixMilli(), ExpiresAtMs: now.Add(time.Minute).UnixMilli()})
		if err != nil {
			t.Fatal(err)
		}
		ask := func() string {
			id := ids.New("tun")
			g.opens <- &nodev1.TunnelOpen{TunnelId: id, Ticket: st}
			return (<-g.hellos).GetRefused()
		}
		if r := ask(); r != "" {
			t.Fatalf("first use refused: %s", r)
		}
		if s := <-got; s != "ping" {
			t.Fatalf("the port got %q", s)
		}
		n.Stop()
		n = e.OpenNodeAtWith(t, joined.Dir, "", addr, slow)
		n.Start(t)
		<-g.up
		if r := ask(); r != string(tickets.ReasonSpent) {
			t.Fatalf("the ticket again after a restart: refused %q, want %q", r, tickets.ReasonSpent)
		}
		select {
		case s := <-got:
			t.Fatalf("the replayed ticket reached the port: %q", s)
		default:
		}
	})
}
