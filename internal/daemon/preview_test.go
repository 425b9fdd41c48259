package daemon_test

import (
	"context"
	"crypto/tls"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
	"github.com/bettercompute/bettercompute/internal/tickets"
)

// dialDriver is a node's driver with one sandbox, "sb-one", whose port
// is a real listener's: DialSandbox connects to it (counting), and
// refuses any other sandbox as gone.
type dialDriver struct {
	driver.Driver
	addr  string
	dials atomic.Int64
}

func (d *dialDriver) DialSandbox(ctx context.Context, sandboxID string, port uint16) (net.Conn, error) {
	if sandboxID != "sb-one" {
		return nil, driver.ErrPreviewSandboxGone
	}
	d.dials.Add(1)
	host, _, _ := net.SplitHostPort(d.addr)
	var nd net.Dialer
	return nd.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(int(port))))
}

// TestNodeVerifiesPreviewTicketsItself: a gateway that verifies nothing
// sends the node preview TunnelOpens; the node connects into the sandbox
// only for a genuine, fresh preview ticket for itself, the sandbox and the
// port the TunnelOpen names, once; an exec or tunnel ticket presented as
// a preview, a preview ticket presented as an exec or a node tunnel, and
// a preview for another sandbox or port are refused by exact reason, and
// nothing is dialled.
func TestNodeVerifiesPreviewTicketsItself(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		// The node's allowed port has a listener that records what it gets.
		port, got := recordingListener(t)
		g := &rogueGateway{opens: make(chan *nodev1.TunnelOpen), hellos: make(chan *nodev1.TunnelHello), up: make(chan struct{}, 1)}
		cfg := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{gatewayCert(t, e.Bundle, e.KEK, e.Bundle.TrustDomain)}, ClientAuth: tls.RequestClientCert}
		addr, _ := serve(t, cfg, g, false)
		joined := e.Join(t, pki.RoleNode, "")
		joined.Close()
		var dd *dialDriver
		n := e.OpenNodeAtWith(t, joined.Dir, "", addr, func(c *daemon.Config) {
			// The node tunnel allow list holds another port: a preview
			// never goes through it.
			c.TunnelPorts = []uint32{22}
			dd = &dialDriver{Driver: c.Driver, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port)))}
			c.Driver = dd
		})
		n.Start(t)
		<-g.up
		self := n.NodeID()
		now := e.Clock.Now()
		ticket := func(mod func(*nodev1.TicketBody)) *nodev1.SignedTicket {
			b := &nodev1.TicketBody{Jti: ids.New("j"), NodeId: self, SandboxId: "sb-one", Port: port, Action: tickets.ActionSandboxPreview, TenantId: "t-acme", Caller: "preview-proxy",
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
		ask := func(st *nodev1.SignedTicket, sandbox string, p uint32) string {
			id := ids.New("tun")
			g.opens <- &nodev1.TunnelOpen{TunnelId: id, Ticket: st, SandboxId: sandbox, Port: p}
			h := <-g.hellos
			if h.GetTunnelId() != id {
				t.Fatalf("hello for %q, want %q", h.GetTunnelId(), id)
			}
			return h.GetRefused()
		}
		good := ticket(nil)
		if r := ask(good, "sb-one", port); r != "" {
			t.Fatalf("genuine preview refused: %s", r)
		}
		if s := <-got; s != "ping" {
			t.Fatalf("the sandbox's port got %q", s)
		}
		for _, c := range []struct {
			name    string
			st      *nodev1.SignedTicket
			sandbox string
			port    uint32
			want    string
		}{
			{"spent", good, "sb-one", port, string(tickets.ReasonSpent)},
			{"for another sandbox than named", ticket(nil), "sb-two", port, string(tickets.ReasonWrongSandbox)},
			{"for another port than named", ticket(nil), "sb-one", port + 1, string(tickets.ReasonWrongPort)},
			{"another node's", ticket(func(b *nodev1.TicketBody) { b.NodeId = "n-other" }), "sb-one", port, string(tickets.ReasonWrongNode)},
			{"an exec ticket presented as a preview", ticket(func(b *nodev1.TicketBody) {
				b.Action, b.Port, b.Argv = tickets.ActionSandboxExec, 0, []string{"sh"}
			}), "sb-one", port, string(tickets.ReasonWrongPort)},
			{"a node tunnel ticket presented as a preview", ticket(func(b *nodev1.TicketBody) {
				b.Action, b.SandboxId = tickets.ActionNodeTunnel, ""
			}), "sb-one", port, string(tickets.ReasonWrongSandbox)},
			{"a preview ticket with a program", ticket(func(b *nodev1.TicketBody) { b.Argv = []string{"sh"} }), "sb-one", port, string(tickets.ReasonMalformed)},
			{"a preview ticket presented as an exec", ticket(nil), "sb-one", 0, string(tickets.ReasonWrongPort)},
			{"a preview ticket presented as a node tunnel", ticket(nil), "", 0, nodev1.TunnelPortNotAllowed},
			{"expired", ticket(func(b *nodev1.TicketBody) {
				b.IssuedAtMs, b.ExpiresAtMs = now.Add(-2*time.Minute).UnixMilli(), now.Add(-time.Minute).UnixMilli()
			}), "sb-one", port, string(tickets.ReasonExpired)},
			{"a genuine preview of a sandbox the host does not run", ticket(func(b *nodev1.TicketBody) { b.SandboxId = "sb-gone" }), "sb-gone", port, nodev1.PreviewSandboxGone},
		} {
			if r := ask(c.st, c.sandbox, c.port); r != c.want {
				t.Errorf("%s: refused %q, want %q", c.name, r, c.want)
			}
		}
		select {
		case s := <-got:
			t.Fatalf("a refused ticket reached the port: %q", s)
		default:
		}
		if d := dd.dials.Load(); d != 1 {
			t.Fatalf("%d dials into sb-one, want 1", d)
		}
	})
}
