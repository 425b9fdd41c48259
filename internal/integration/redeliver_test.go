package integration

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/daemon/journal"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
	"google.golang.org/protobuf/proto"
)

// cutProxy relays TCP between nodes and the gateway on loopback. A test
// can make the connections open now drop what one side sends (read and
// discarded, so the other side never sees it) and then cut them; new
// connections are relayed whole.
type cutProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	relays []*relay
}

// relay is one relayed connection.
type relay struct {
	node, gw             net.Conn
	dropToNode, dropToGW atomic.Bool
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target}
	t.Cleanup(func() {
		ln.Close()
		p.cut()
	})
	go p.serve()
	return p
}

func (p *cutProxy) addr() string { return p.ln.Addr().String() }

func (p *cutProxy) serve() {
	for {
		node, err := p.ln.Accept()
		if err != nil {
			return
		}
		gw, err := net.Dial("tcp", p.target)
		if err != nil {
			node.Close()
			continue
		}
		r := &relay{node: node, gw: gw}
		p.mu.Lock()
		p.relays = append(p.relays, r)
		p.mu.Unlock()
		go pipe(r, gw, node, &r.dropToGW)
		go pipe(r, node, gw, &r.dropToNode)
	}
}

// pipe copies src to dst, discarding what it reads while drop is set,
// until either side fails; it then closes both.
func pipe(r *relay, dst, src net.Conn, drop *atomic.Bool) {
	defer r.close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !drop.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (r *relay) close() {
	r.node.Close()
	r.gw.Close()
}

// drop makes the open connections discard what the gateway sends
// (toNode) or what the node sends (!toNode).
func (p *cutProxy) drop(toNode bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.relays {
		if toNode {
			r.dropToNode.Store(true)
		} else {
			r.dropToGW.Store(true)
		}
	}
}

// cut closes every open connection, both sides.
func (p *cutProxy) cut() {
	p.mu.Lock()
	rs := p.relays
	p.relays = nil
	p.mu.Unlock()
	for _, r := range rs {
		r.close()
	}
}

// nodeViaProxy joins a node and opens it against the proxy's address
// (not started).
func nodeViaProxy(t *testing.T, e *testenv.Env, p *cutProxy) *testenv.Node {
	t.Helper()
	joined := e.Join(t, pki.RoleNode, "")
	if err := joined.Close(); err != nil {
		t.Fatal(err)
	}
	return e.OpenNodeAt(t, joined.Dir, "", p.addr())
}

// commandState reads command id's state.
func commandState(t *testing.T, e *testenv.Env, id string) string {
	t.Helper()
	c, err := e.CP.Commands.Get(context.Background(), iam.RootScope(), id)
	if err != nil {
		t.Fatal(err)
	}
	return string(c.State)
}

// journaledFinal reads, from a copy of the node's journal (the node may
// still append to its own), the final update it journaled for id.
func journaledFinal(t *testing.T, dir, id string) bool {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "journal.log"))
	if errors.Is(err, os.ErrNotExist) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	cp := filepath.Join(t.TempDir(), "journal.log")
	if err := os.WriteFile(cp, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	j, err := journal.Open(cp, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	_, ok := j.Final(id)
	return ok
}

// TestSentCommandRedeliveredAfterSessionDrop replays issue 23 item 5: the
// gateway wrote a command to the stream and recorded it sent, and the
// session dropped before the node read it. The command goes back to the
// queue and the node's next session runs it, once, long before its expiry
// (an hour away; before the fix it stayed sent until a minute past it).
func TestSentCommandRedeliveredAfterSessionDrop(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		p := newCutProxy(t, e.CP.GatewayAddr)
		n := nodeViaProxy(t, e, p)
		n.Start(t)
		n.WaitConnected(t)

		p.drop(true) // the node reads nothing more on this connection
		c, err := e.CP.Commands.Create(context.Background(), admin, n.NodeID(), "diag.run", nil, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		pollUntil(t, "command recorded sent", func() bool { return commandState(t, e, c.ID) == "sent" })
		p.cut()

		got := e.WaitCommand(t, c.ID)
		if got.State != "succeeded" || !got.Attested {
			t.Fatalf("command: %s attested=%v, want succeeded attested", got.State, got.Attested)
		}
		if runs := n.Sim.Runs("diag.run"); runs != 1 {
			t.Fatalf("diag.run ran %d times, want 1", runs)
		}
		if !got.UpdatedAt.Before(got.ExpiresAt) {
			t.Fatalf("finished at %s, not before its expiry %s", got.UpdatedAt, got.ExpiresAt)
		}
	})
}

// TestRedeliveredJournaledCommandAnsweredOnce: the node ran a command and
// journaled its result, which never reached the gateway, and the session
// dropped; the command, still sent, goes back to the queue when the
// gateway sees the session end, before any Hello. The restarted
// node (its journal holding the result as acknowledged, so that only the
// redelivery can bring it) answers the copy as a replay with the result
// it journaled: one recorded result, no second run.
func TestRedeliveredJournaledCommandAnsweredOnce(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx := context.Background()
		p := newCutProxy(t, e.CP.GatewayAddr)
		n := nodeViaProxy(t, e, p)
		n.Start(t)
		n.WaitConnected(t)

		p.drop(false) // the gateway hears nothing more from the node on this connection
		c, err := e.CP.Commands.Create(ctx, admin, n.NodeID(), "diag.run", nil, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		pollUntil(t, "result journaled", func() bool { return journaledFinal(t, n.Dir, c.ID) })
		// The node's result is held back, so the command stays sent once
		// the dispatcher's round records it (the node may have run it first).
		pollUntil(t, "command recorded sent", func() bool { return commandState(t, e, c.ID) == "sent" })
		n.Stop()
		p.cut()
		// The gateway's end of the session requeues it, with no Hello yet.
		pollUntil(t, "command requeued", func() bool { return commandState(t, e, c.ID) == "queued" })
		j, err := journal.Open(filepath.Join(n.Dir, "journal.log"), time.Now(), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		first, ok := j.Final(c.ID)
		if !ok {
			t.Fatal("result not journaled")
		}
		if err := j.Ack(c.ID); err != nil {
			t.Fatal(err)
		}
		j.Close()

		n2 := e.OpenNodeAt(t, n.Dir, "", p.addr())
		n2.Start(t)
		got := e.WaitCommand(t, c.ID)
		if got.State != "succeeded" || !got.Attested {
			t.Fatalf("command: %s attested=%v, want succeeded attested", got.State, got.Attested)
		}
		if runs := n.Sim.Runs("diag.run") + n2.Sim.Runs("diag.run"); runs != 1 {
			t.Fatalf("diag.run ran %d times, want 1", runs)
		}
		if r := n2.Refusals()[daemon.ReasonReplayed]; r != 1 {
			t.Fatalf("replays answered %d, want 1", r)
		}
		var body []byte
		if err := db.QueryRowContext(ctx, `SELECT update_body FROM commands WHERE id = $1`, c.ID).Scan(&body); err != nil {
			t.Fatal(err)
		}
		if !sameUpdateBody(t, first, body) {
			t.Fatal("the recorded result is not the one the node journaled")
		}
	})
}

// TestSentCommandOfDeadGatewayRedelivered: a gateway died right after
// recording a command sent on a session (nothing ended that session: its
// row only goes stale). The node's next Hello supersedes it and the
// command is delivered on the new session.
func TestSentCommandOfDeadGatewayRedelivered(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		ctx := context.Background()
		n := e.Nodes[0]
		stopNode(t, db, n)
		c, err := e.CP.Commands.Create(ctx, admin, n.NodeID(), "diag.run", nil, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		pollUntil(t, "command signed", func() bool { return signed(t, db, c.ID) })
		if _, err := db.ExecContext(ctx, `UPDATE commands SET state = 'sent', sent_session = 's-dead-gateway' WHERE id = $1`, c.ID); err != nil {
			t.Fatal(err)
		}
		n2 := e.OpenNode(t, n.Dir, "")
		n2.Start(t)
		got := e.WaitCommand(t, c.ID)
		if got.State != "succeeded" || n2.Sim.Runs("diag.run") != 1 {
			t.Fatalf("command: %s, ran %d times; want succeeded once", got.State, n2.Sim.Runs("diag.run"))
		}
	})
}

// signed reports whether command id has its signed body.
func signed(t *testing.T, db *store.DB, id string) bool {
	t.Helper()
	var n int
	if err := db.QueryRowContext(context.Background(), `SELECT COUNT(*) FROM commands WHERE id = $1 AND body IS NOT NULL`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// sameUpdateBody reports whether the signed body recorded is the one in
// the journaled update raw.
func sameUpdateBody(t *testing.T, raw, recorded []byte) bool {
	t.Helper()
	var u nodev1.CommandUpdate
	if err := proto.Unmarshal(raw, &u); err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(u.Body, recorded)
}
