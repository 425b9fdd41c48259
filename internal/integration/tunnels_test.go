package integration

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/api"
	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/revocations/revwire"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
	"github.com/bettercompute/bettercompute/internal/tickets"
	"github.com/bettercompute/bettercompute/internal/tunnelwire"
)

// echoServer listens on loopback and echoes each connection until its
// client half-closes; it returns the port.
func echoServer(t *testing.T) uint32 {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
				_ = c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	return uint32(lis.Addr().(*net.TCPAddr).Port)
}

// tunnelEnv is an environment whose nodes allow tunnels to ports.
func tunnelEnv(t *testing.T, db *store.DB, nodes int, ports ...uint32) *testenv.Env {
	return testenv.Start(t, db, testenv.Options{Nodes: nodes, NodeTune: func(c *daemon.Config) { c.TunnelPorts = ports }})
}

// TestTunnelCarriesBytesToAllowedPort: a tunnel to a port on the node's
// list carries bytes both ways, half-closes in order, ends without an
// error, and leaves a ticket-issued and a tunnel-closed audit row.
func TestTunnelCarriesBytesToAllowedPort(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		port := echoServer(t)
		e := tunnelEnv(t, db, 1, port)
		ctx := context.Background()
		tun, err := e.Client.OpenTunnel(ctx, e.Nodes[0].NodeID(), int(port))
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		defer tun.Close()
		msg := strings.Repeat("through the node's own session ", 4000) // over one frame
		go func() {
			_, _ = tun.Write([]byte(msg))
			_ = tun.CloseWrite()
		}()
		got, err := io.ReadAll(tun)
		if err != nil || string(got) != msg {
			t.Fatalf("echo: %d bytes, err %v", len(got), err)
		}
		if err := tun.Wait(); err != nil {
			t.Fatalf("end: %v", err)
		}
		list, err := e.Client.AuditList(ctx, "", 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		var issued, closed bool
		for _, ev := range list.Events {
			if ev.Action == tickets.ActionNodeTunnel && ev.Resource == "node/"+e.Nodes[0].NodeID() {
				issued = issued || ev.Outcome == "allowed" && strings.Contains(ev.Details, `"event":"ticket-issued"`)
				closed = closed || ev.Outcome == "tunnel-closed" && strings.Contains(ev.Details, `"reason":"closed"`)
			}
		}
		if !issued || !closed {
			t.Fatalf("audit rows: issued %v closed %v", issued, closed)
		}
		// The spent ticket is in the revocation feed, for its node.
		all, err := e.CP.Revocations.Since(ctx, 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		spent := 0
		for _, en := range all {
			if en.Kind == revwire.KindTicket && en.NodeID == e.Nodes[0].NodeID() && en.Reason == "ticket-spent" {
				spent++
			}
		}
		if spent != 1 {
			t.Fatalf("%d ticket entries in the feed for the node, want 1: %+v", spent, all)
		}
	})
}

// TestTunnelRefusesPortNotOnNodeList: the control plane issues a ticket
// for any port, but the node serves only its own list: a port not on it
// is refused by the node, and the client gets ACCESS_DENIED naming the
// node's reason.
func TestTunnelRefusesPortNotOnNodeList(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		allowed := echoServer(t)
		other := echoServer(t)
		e := tunnelEnv(t, db, 1, allowed)
		_, err := e.Client.OpenTunnel(context.Background(), e.Nodes[0].NodeID(), int(other))
		wantAPIError(t, err, "ACCESS_DENIED", nodev1.TunnelPortNotAllowed)
		if got := e.Nodes[0].Refusals()["tunnel:"+nodev1.TunnelPortNotAllowed]; got != 1 {
			t.Fatalf("node refusals: %v", e.Nodes[0].Refusals())
		}
	})
}

// wantAPIError asserts err is an API error of code whose message
// contains reason.
func wantAPIError(t *testing.T, err error, code, reason string) {
	t.Helper()
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != code || !strings.Contains(ce.Message, reason) {
		t.Fatalf("got %v, want %s with %q", err, code, reason)
	}
}

// openTicket asks tunnels.open with c for a ticket to port on node.
func openTicket(t *testing.T, c *client.Client, node string, port uint32) apitypes.TunnelTicket {
	t.Helper()
	var tk apitypes.TunnelTicket
	if err := c.Call(context.Background(), "tunnels.open", apitypes.TunnelOpenIn{NodeID: node, Port: int64(port)}, &tk); err != nil {
		t.Fatalf("tunnels.open: %v", err)
	}
	return tk
}

// connectRaw presents ticket to the tunnel endpoint for node and port
// with key, and returns the error answer's code and message ("" and ""
// for 101, whose connection it closes).
func connectRaw(t *testing.T, e *testenv.Env, key, node string, port uint32, ticket string) (code, msg string) {
	t.Helper()
	q := url.Values{"node": {node}, "port": {strconv.Itoa(int(port))}}
	req, _ := http.NewRequest(http.MethodGet, e.APIURL()+api.TunnelConnectPath+"?"+q.Encode(), nil)
	req.Header.Set("X-Better-Compute", "1")
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", tunnelwire.Protocol)
	req.Header.Set(api.TicketHeader, ticket)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		return "", ""
	}
	var eb apitypes.ErrorBody
	if err := json.NewDecoder(resp.Body).Decode(&eb); err != nil {
		t.Fatalf("status %d: %v", resp.StatusCode, err)
	}
	return eb.Error.Code, eb.Error.Message
}

// signTicket has the control plane's worker key sign body, as
// tunnels.open would, with body's fields as given.
func signTicket(t *testing.T, e *testenv.Env, body *nodev1.TicketBody) string {
	t.Helper()
	st, err := e.CP.Signer.SignTicket(context.Background(), body)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := proto.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(raw)
}

// TestTunnelTicketRefusals: a spent, foreign-node, other-port,
// expired, malformed, oversized, another caller's and an
// unexpected-action ticket are each refused with their exact code and
// reason, and none of them reaches the node.
func TestTunnelTicketRefusals(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		port := echoServer(t)
		e := tunnelEnv(t, db, 2, port)
		a, b := e.Nodes[0].NodeID(), e.Nodes[1].NodeID()
		now := e.Clock.Now()
		body := func(mod func(*nodev1.TicketBody)) string {
			bd := &nodev1.TicketBody{Jti: ids.New("j"), NodeId: a, Port: port, Action: tickets.ActionNodeTunnel, TenantId: "root", Caller: "admin",
				IssuedAtMs: now.UnixMilli(), ExpiresAtMs: now.Add(time.Minute).UnixMilli()}
			mod(bd)
			return signTicket(t, e, bd)
		}
		spent := openTicket(t, e.Client, a, port)
		if code, msg := connectRaw(t, e, e.AdminKey, a, port, spent.Ticket); code != "" {
			t.Fatalf("first use refused: %s %s", code, msg)
		}
		bTicket := openTicket(t, e.Client, b, port)
		otherPort := openTicket(t, e.Client, a, port+1)
		for _, c := range []struct {
			name, node, ticket, code, reason string
		}{
			{"spent", a, spent.Ticket, "ACCESS_DENIED", string(tickets.ReasonSpent)},
			{"another node's", a, bTicket.Ticket, "ACCESS_DENIED", string(tickets.ReasonWrongNode)},
			{"another port's", a, otherPort.Ticket, "ACCESS_DENIED", string(tickets.ReasonWrongPort)},
			{"expired", a, body(func(b *nodev1.TicketBody) {
				b.IssuedAtMs, b.ExpiresAtMs = now.Add(-2*time.Minute).UnixMilli(), now.Add(-time.Minute).UnixMilli()
			}), "ACCESS_DENIED", string(tickets.ReasonExpired)},
			{"too long-lived", a, body(func(b *nodev1.TicketBody) { b.ExpiresAtMs = now.Add(time.Hour).UnixMilli() }), "ACCESS_DENIED", string(tickets.ReasonLifetimeTooLong)},
			{"unexpected action", a, body(func(b *nodev1.TicketBody) { b.Action = "compute:nodes:ssh-root" }), "ACCESS_DENIED", string(tickets.ReasonUnexpectedAction)},
			{"another caller's", a, body(func(b *nodev1.TicketBody) { b.Caller = "someone-else" }), "ACCESS_DENIED", "ticket-wrong-caller"},
			{"malformed", a, "bm90IGEgdGlja2V0", "INVALID_INPUT", string(tickets.ReasonMalformed)},
			{"not base64", a, "%%%", "INVALID_INPUT", string(tickets.ReasonMalformed)},
			{"oversized", a, strings.Repeat("A", 8000), "PAYLOAD_TOO_LARGE", string(tickets.ReasonOversized)},
		} {
			if code, msg := connectRaw(t, e, e.AdminKey, c.node, port, c.ticket); code != c.code || !strings.Contains(msg, c.reason) {
				t.Errorf("%s ticket: %s %q, want %s %s", c.name, code, msg, c.code, c.reason)
			}
		}
		for _, n := range e.Nodes {
			if r := n.Refusals(); len(r) != 0 {
				t.Errorf("a refused ticket reached node %s: %v", n.NodeID(), r)
			}
		}
	})
}

// TestTunnelOpenTenantIsolation: a tenant's caller asking for a tunnel
// to another tenant's node, or to a node that does not exist, gets the
// same answer (the envelope's ACCESS_DENIED, which names no difference),
// but for the id it was asked about.
func TestTunnelOpenTenantIsolation(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := tunnelEnv(t, db, 0, 22)
		tenantA, adminA := e.TenantAdmin(t, "tun-a")
		tenantB, _ := e.TenantAdmin(t, "tun-b")
		_ = joinTenantNode(t, e, tenantA, "box-a")
		nodeB := joinTenantNode(t, e, tenantB, "box-b")
		_ = tenantA
		ctx := context.Background()
		var out apitypes.TunnelTicket
		errForeign := adminA.Call(ctx, "tunnels.open", apitypes.TunnelOpenIn{NodeID: nodeB.NodeID(), Port: 22}, &out)
		errMissing := adminA.Call(ctx, "tunnels.open", apitypes.TunnelOpenIn{NodeID: "n-does-not-exist", Port: 22}, &out)
		var f, m *client.Error
		if !errors.As(errForeign, &f) || !errors.As(errMissing, &m) || f.Code != "ACCESS_DENIED" || f.Code != m.Code || f.Status != m.Status ||
			strings.ReplaceAll(f.Message, nodeB.NodeID(), "X") != strings.ReplaceAll(m.Message, "n-does-not-exist", "X") {
			t.Fatalf("foreign node: %v; missing node: %v", errForeign, errMissing)
		}
	})
}

// TestTunnelOpenRateLimited: the 11th ticket in a minute for one
// identity is RATE_LIMITED with a Retry-After; another identity is not
// affected.
func TestTunnelOpenRateLimited(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := tunnelEnv(t, db, 1, 22)
		node := e.Nodes[0].NodeID()
		ctx := context.Background()
		c := e.NewClient(t, e.AdminKey)
		c.Retry.MaxTries = 1
		for i := range 10 {
			var out apitypes.TunnelTicket
			if err := c.Call(ctx, "tunnels.open", apitypes.TunnelOpenIn{NodeID: node, Port: 22}, &out); err != nil {
				t.Fatalf("ticket %d: %v", i+1, err)
			}
		}
		var out apitypes.TunnelTicket
		err := c.Call(ctx, "tunnels.open", apitypes.TunnelOpenIn{NodeID: node, Port: 22}, &out)
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Code != "RATE_LIMITED" || ce.RetryAfter < time.Second {
			t.Fatalf("11th ticket: %v", err)
		}
		_, other := e.TenantAdmin(t, "tun-rl")
		_ = other
		otherRoot := e.IdentityClient(t, "root", "tun-rl-root", "admin")
		if err := otherRoot.Call(ctx, "tunnels.open", apitypes.TunnelOpenIn{NodeID: node, Port: 22}, &out); err != nil {
			t.Fatalf("another identity: %v", err)
		}
	})
}

// tunnelCaller is an identity in a new tenant bound to admin, with a
// tenant node allowing tunnels to port: its client, key id, identity id
// and tenant, and the node.
type tunnelCaller struct {
	c                       *client.Client
	keyID, identity, tenant string
	node                    *testenv.Node
}

func newTunnelCaller(t *testing.T, e *testenv.Env, name string) tunnelCaller {
	t.Helper()
	ctx := context.Background()
	tn, err := e.Client.CreateTenant(ctx, "", name)
	if err != nil {
		t.Fatal(err)
	}
	id, err := e.Client.CreateIdentity(ctx, tn.ID, name+"-op", "person")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Client.Bind(ctx, tn.ID, id.ID, "admin"); err != nil {
		t.Fatal(err)
	}
	k, err := e.Client.CreateAPIKey(ctx, tn.ID, id.ID, name, 0)
	if err != nil {
		t.Fatal(err)
	}
	return tunnelCaller{c: e.NewClient(t, k.Key), keyID: k.ID, identity: id.ID, tenant: tn.ID, node: joinTenantNode(t, e, tn.ID, name+"-box")}
}

// echoOnce writes msg through tun and reads it back.
func echoOnce(t *testing.T, tun *client.Tunnel, msg string) {
	t.Helper()
	if _, err := tun.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(tun, buf); err != nil || string(buf) != msg {
		t.Fatalf("echo: %q %v", buf, err)
	}
}

// TestTunnelClosedWhenAccessRevoked: an open tunnel is closed, with
// ACCESS_DENIED, when its caller's API key is revoked, when its role
// binding is deleted, or when its tenant is suspended; the client's read
// ends with that error (no sleep: the read blocks until the close).
func TestTunnelClosedWhenAccessRevoked(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		port := echoServer(t)
		e := tunnelEnv(t, db, 0, port)
		ctx := context.Background()
		for _, c := range []struct {
			name   string
			revoke func(tc tunnelCaller) error
		}{
			{"api key revoked", func(tc tunnelCaller) error {
				return e.Client.Call(ctx, "apiKeys.revoke", apitypes.IDIn{ID: tc.keyID}, nil)
			}},
			{"binding deleted", func(tc tunnelCaller) error {
				bs, err := e.Client.Bindings(ctx, tc.tenant)
				if err != nil {
					return err
				}
				for _, b := range bs {
					if b.IdentityID == tc.identity {
						if err := e.Client.Call(ctx, "bindings.delete", apitypes.TenantIDIn{TenantIn: apitypes.TenantIn{TenantID: tc.tenant}, ID: b.ID}, nil); err != nil {
							return err
						}
					}
				}
				return nil
			}},
			{"tenant suspended", func(tc tunnelCaller) error {
				_, err := e.Client.SetTenantState(ctx, tc.tenant, "suspend")
				return err
			}},
		} {
			t.Run(c.name, func(t *testing.T) {
				tc := newTunnelCaller(t, e, "rv"+strings.ReplaceAll(c.name, " ", "-"))
				tun, err := tc.c.OpenTunnel(ctx, tc.node.NodeID(), int(port))
				if err != nil {
					t.Fatalf("open: %v", err)
				}
				defer tun.Close()
				echoOnce(t, tun, "before")
				if err := c.revoke(tc); err != nil {
					t.Fatalf("revoke: %v", err)
				}
				// A tunnel left open fails the test (UNAVAILABLE from the
				// client's own close) instead of hanging it.
				defer time.AfterFunc(30*time.Second, func() { tun.Close() }).Stop()
				_, err = io.ReadAll(tun)
				wantAPIError(t, err, "ACCESS_DENIED", "revoked")
			})
		}
	})
}

// TestTunnelClosedWhenNodeDisconnects: a tunnel whose node goes away
// mid-stream ends with UNAVAILABLE saying so; nothing hangs.
func TestTunnelClosedWhenNodeDisconnects(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		port := echoServer(t)
		e := tunnelEnv(t, db, 1, port)
		tun, err := e.Client.OpenTunnel(context.Background(), e.Nodes[0].NodeID(), int(port))
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		defer tun.Close()
		echoOnce(t, tun, "before")
		e.Nodes[0].Stop()
		defer time.AfterFunc(30*time.Second, func() { tun.Close() }).Stop()
		_, err = io.ReadAll(tun)
		wantAPIError(t, err, "UNAVAILABLE", "disconnected")
	})
}

// TestTunnelEndpointShape: the tunnel endpoint refuses, CSRF_REJECTED,
// a request a cross-site page could make (no X-Better-Compute header, a
// POST, no upgrade), before reading any ticket.
func TestTunnelEndpointShape(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := tunnelEnv(t, db, 1, 22)
		u := e.APIURL() + api.TunnelConnectPath + "?node=" + e.Nodes[0].NodeID() + "&port=22"
		for name, mod := range map[string]func(*http.Request){
			"no X-Better-Compute": func(r *http.Request) { r.Header.Del("X-Better-Compute") },
			"POST":                func(r *http.Request) { r.Method = http.MethodPost },
			"no upgrade":          func(r *http.Request) { r.Header.Del("Upgrade") },
			"another protocol":    func(r *http.Request) { r.Header.Set("Upgrade", "websocket") },
		} {
			req, _ := http.NewRequest(http.MethodGet, u, nil)
			req.Header.Set("X-Better-Compute", "1")
			req.Header.Set("Authorization", "Bearer "+e.AdminKey)
			req.Header.Set("Connection", "Upgrade")
			req.Header.Set("Upgrade", tunnelwire.Protocol)
			req.Header.Set(api.TicketHeader, "x")
			mod(req)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var eb apitypes.ErrorBody
			_ = json.NewDecoder(resp.Body).Decode(&eb)
			resp.Body.Close()
			if eb.Error.Code != "CSRF_REJECTED" {
				t.Errorf("%s: %d %s", name, resp.StatusCode, eb.Error.Code)
			}
		}
	})
}

// TestGatewayRefusesUnaskedTunnelStream: a node's Tunnel stream naming a
// tunnel the gateway never asked it to open is refused, PermissionDenied:
// a node cannot attach itself to a client's tunnel.
func TestGatewayRefusesUnaskedTunnelStream(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := tunnelEnv(t, db, 1, 22)
		conn, err := e.Nodes[0].Dial()
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		s, err := nodev1.NewGatewayClient(conn).Tunnel(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&nodev1.TunnelFrame{Frame: &nodev1.TunnelFrame_Hello{Hello: &nodev1.TunnelHello{TunnelId: ids.New("tun")}}}); err != nil {
			t.Fatal(err)
		}
		_, err = s.Recv()
		if status.Code(err) != codes.PermissionDenied {
			t.Fatalf("unasked tunnel stream: %v", err)
		}
	})
}
