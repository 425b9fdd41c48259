package integration

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/gateway"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/server"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// copyNodeDir copies a node's data directory, keeping file modes, as
// someone who took a copy of a machine's files would.
func copyNodeDir(t *testing.T, from string) string {
	t.Helper()
	to := filepath.Join(t.TempDir(), "copy")
	// The node may be running: a file it writes atomically (a temporary
	// name, then a rename) can vanish between the listing and the read.
	// Such a file is skipped; its content is under its final name.
	gone := func(err error) bool { return errors.Is(err, fs.ErrNotExist) }
	err := filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, path)
		dst := filepath.Join(to, rel)
		info, err := d.Info()
		if gone(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(dst, info.Mode().Perm())
		}
		b, err := os.ReadFile(path)
		if gone(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, info.Mode().Perm())
	})
	if err != nil {
		t.Fatalf("copy node dir: %v", err)
	}
	return to
}

// pollUntil checks cond on a 20 ms tick until it holds, failing the test
// after testenv.WaitTimeout with what.
func pollUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	timeout := time.After(testenv.WaitTimeout)
	for !cond() {
		select {
		case <-tick.C:
		case <-timeout:
			t.Fatalf("%s: not within %v", what, testenv.WaitTimeout)
		}
	}
}

// waitEvent polls the event log until an event of typ exists.
func waitEvent(t *testing.T, e *testenv.Env, typ string) {
	t.Helper()
	pollUntil(t, "event "+typ, func() bool { return len(events(t, e, typ)) > 0 })
}

// sessionClosed reports whether the registry shows no open session of
// nodeID.
func sessionClosed(t *testing.T, db *store.DB, nodeID string) bool {
	var open int
	if err := db.QueryRowContext(context.Background(), `SELECT COUNT(*) FROM node_sessions WHERE node_id = $1 AND closed_at IS NULL`, nodeID).Scan(&open); err != nil {
		t.Fatal(err)
	}
	return open == 0
}

// stopNode stops n and waits until the registry shows its session closed,
// so that the next Hello for the node is not a duplicate of it.
func stopNode(t *testing.T, db *store.DB, n *testenv.Node) {
	t.Helper()
	n.Stop()
	pollUntil(t, "session of "+n.NodeID()+" closed in the registry", func() bool { return sessionClosed(t, db, n.NodeID()) })
}

// certsOf returns serial -> revoke reason ("" when valid) of every
// certificate of nodeID.
func certsOf(t *testing.T, db *store.DB, nodeID string) map[string]string {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), `SELECT serial, revoke_reason FROM node_certs WHERE node_id = $1`, nodeID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var serial string
		var reason *string
		if err := rows.Scan(&serial, &reason); err != nil {
			t.Fatal(err)
		}
		out[serial] = ""
		if reason != nil {
			out[serial] = *reason
		}
	}
	return out
}

// TestRenewDoesNotEvadeDuplicateDetection reproduces the attack with a copy
// of a node's identity.json: the copy renews as fast as it can to get
// certificates of its own, then both run. Renewals are rate limited per
// node, the renewal supersedes the certificate that asked once the new one
// is in use, flips are counted per node whatever certificate each Hello
// used, and the quarantine revokes every certificate of the node, so the
// copy is out as well as the original.
func TestRenewDoesNotEvadeDuplicateDetection(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		a := e.Nodes[0]
		ctx := context.Background()
		copyDir := copyNodeDir(t, a.Dir)
		clone := e.OpenNode(t, copyDir, "b-clone")
		conn, err := clone.Dial()
		if err != nil {
			t.Fatal(err)
		}
		defer func() { conn.Close() }()
		renewed := 0
		for i := 0; i < 6; i++ {
			err := clone.Renew(ctx, conn)
			if err == nil {
				// Reconnect with the new certificate, as the daemon does:
				// the renewal proof is made with the current key, so it
				// must be the key of the certificate the connection shows.
				renewed++
				conn.Close()
				if conn, err = clone.Dial(); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if st := status.Convert(errors.Unwrap(err)); st.Code() != codes.PermissionDenied || st.Message() != "ACCESS_DENIED" {
				t.Fatalf("renewal %d: %v, want ACCESS_DENIED", i, err)
			}
		}
		if renewed != 1 {
			t.Fatalf("the copy renewed %d times in a row, want 1", renewed)
		}
		if !hasReason(t, e, nodes.EventRenewRefused, "renew-rate-limited") {
			t.Fatal("no renew-rate-limited refusal recorded")
		}
		var audited int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit_events WHERE action = $1 AND outcome = 'refused' AND details LIKE '%renew-rate-limited%'`,
			nodes.EventRenewRefused).Scan(&audited); err != nil || audited == 0 {
			t.Fatalf("renew-rate-limited audit rows: %d (%v)", audited, err)
		}
		if got := len(certsOf(t, db, a.NodeID())); got != 2 {
			t.Fatalf("node has %d certificates, want 2 (join and one renewal)", got)
		}
		// Both run: the copy with its renewed certificate, the original
		// with the one it joined with.
		clone.Start(t)
		waitEvent(t, e, nodes.EventQuarantined)
		a.WaitDisconnected(t)
		clone.WaitDisconnected(t)
		certs := certsOf(t, db, a.NodeID())
		for serial, reason := range certs {
			if reason == "" {
				t.Fatalf("certificate %s of the quarantined node is still valid: %v", serial, certs)
			}
		}
		if certs[clone.Serial()] != nodes.ReasonDuplicateIdentity {
			t.Fatalf("the copy's renewed certificate: %q, want %s", certs[clone.Serial()], nodes.ReasonDuplicateIdentity)
		}
		if certs[a.Serial()] != nodes.ReasonSuperseded {
			t.Fatalf("the original certificate: %q, want %s", certs[a.Serial()], nodes.ReasonSuperseded)
		}
		q := events(t, e, nodes.EventQuarantined)
		if len(q) != 1 || q[0].Details["count"] != float64(nodes.FlipLimit+1) {
			t.Fatalf("quarantine events: %+v", q)
		}
		for _, x := range []*testenv.Node{a, clone} {
			if c := rawSessionCode(t, e.CP.GatewayAddr, clientTLS(t, x), x.NodeID()); c != codes.Unauthenticated {
				t.Fatalf("Hello after quarantine: %v, want Unauthenticated", c)
			}
		}
	})
}

// TestRenewalSupersedesOldCertificate: the certificate a renewal was asked
// with is revoked as superseded at the first Hello with the new one, and a
// renewal sooner than the node's renewal interval is refused.
func TestRenewalSupersedesOldCertificate(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		n := e.Nodes[0]
		ctx := context.Background()
		old := n.Serial()
		conn, err := n.Dial()
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if err := n.Renew(ctx, conn); err != nil {
			t.Fatalf("renew: %v", err)
		}
		if certs := certsOf(t, db, n.NodeID()); certs[old] != "" {
			t.Fatalf("old certificate revoked before the new one is used: %v", certs)
		}
		// The node's current session still uses the old certificate; its
		// next one uses the new.
		stopNode(t, db, n)
		n2 := e.OpenNode(t, n.Dir, "")
		n2.Start(t)
		n2.WaitConnected(t)
		certs := certsOf(t, db, n.NodeID())
		if certs[old] != nodes.ReasonSuperseded || certs[n2.Serial()] != "" {
			t.Fatalf("certificates after the first Hello with the new one: %v", certs)
		}
		if len(events(t, e, nodes.EventDuplicateSession)) != 0 {
			t.Fatal("a renewal counted as a duplicate session")
		}
		wantFeedEntry(t, e, old, nodes.ReasonSuperseded)
	})
}

// TestDuplicateAcrossGateways: copies of one identity connected to two
// gateway processes. The second session closes the first within 5 s on the
// other gateway, each alternation counts as on one process, and the node is
// quarantined.
func TestDuplicateAcrossGateways(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		gw2 := e.StartGateway(t)
		a := e.Nodes[0]
		copyDir := copyNodeDir(t, a.Dir)

		t.Run("closed within 5s", func(t *testing.T) {
			// The original, as a raw session on gateway 1 that does not
			// reconnect, so its close is seen exactly.
			stopNode(t, db, a)
			s, cancel := welcomedSession(t, e.CP.GatewayAddr, a, "b-original")
			defer cancel()
			clone := e.OpenNodeAt(t, copyDir, "b-copy", gw2.GatewayAddr)
			clone.Start(t)
			clone.WaitConnected(t)
			closed := make(chan error, 1)
			go func() {
				for {
					if _, err := s.Recv(); err != nil {
						closed <- err
						return
					}
				}
			}()
			select {
			case err := <-closed:
				if status.Code(err) != codes.Aborted {
					t.Fatalf("first session ended with %v, want Aborted (superseded)", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the first session on gateway 1 was not closed within 5 s")
			}
			dups := events(t, e, nodes.EventDuplicateSession)
			if len(dups) != 1 || dups[0].Details["previous_boot_id"] != gateway.BootTag("b-original") || dups[0].Details["boot_id"] != gateway.BootTag("b-copy") {
				t.Fatalf("duplicate-session events: %+v", dups)
			}
			stopNode(t, db, clone)
		})

		t.Run("quarantined", func(t *testing.T) {
			orig := e.OpenNode(t, a.Dir, "")
			orig.Start(t)
			clone := e.OpenNodeAt(t, copyDir, "", gw2.GatewayAddr)
			clone.Start(t)
			waitEvent(t, e, nodes.EventQuarantined)
			orig.WaitDisconnected(t)
			clone.WaitDisconnected(t)
			for serial, reason := range certsOf(t, db, a.NodeID()) {
				if reason != nodes.ReasonDuplicateIdentity {
					t.Fatalf("certificate %s: %q, want %s", serial, reason, nodes.ReasonDuplicateIdentity)
				}
			}
			if n := len(events(t, e, nodes.EventDuplicateSession)); n != nodes.FlipLimit {
				t.Fatalf("%d duplicate-session events, want %d", n, nodes.FlipLimit)
			}
			if c := rawSessionCode(t, gw2.GatewayAddr, clientTLS(t, clone), clone.NodeID()); c != codes.Unauthenticated {
				t.Fatalf("Hello after quarantine: %v, want Unauthenticated", c)
			}
		})
	})
}

// TestQuietSessionSupersededWithoutFlip: a session whose gateway stopped
// refreshing its heartbeat (a gateway that died) is superseded by a Hello
// from another boot without counting a flip, and the gateway that held it
// closes it if it is still there.
func TestQuietSessionSupersededWithoutFlip(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		clk := clock.NewFake(time.Now())
		e := testenv.Start(t, db, testenv.Options{Nodes: 1, Clock: clk})
		// Gateway 2 never refreshes its sessions' heartbeat.
		gw2 := e.StartGatewayWith(t, func(o *server.Options) { o.SessionHeartbeat = time.Hour; o.RevocationPoll = 100 * time.Millisecond })
		a := e.Nodes[0]
		stopNode(t, db, a)
		s, cancel := welcomedSession(t, gw2.GatewayAddr, a, "b-quiet")
		defer cancel()
		clk.Advance(nodes.SessionQuietAfter + time.Second)
		b := e.OpenNode(t, a.Dir, "b-new")
		b.Start(t)
		b.WaitConnected(t)
		if dups := events(t, e, nodes.EventDuplicateSession); len(dups) != 0 {
			t.Fatalf("a quiet session counted as a flip: %+v", dups)
		}
		for {
			if _, err := s.Recv(); err != nil {
				if status.Code(err) != codes.Aborted {
					t.Fatalf("quiet session ended with %v, want Aborted (superseded)", err)
				}
				break
			}
		}
	})
}

// sentToVanishingSession creates a command of kind for n, lets the gateway
// send it on a raw session with n's certificate that reads it and never
// answers, waits until the command is recorded sent, then drops the session
// and waits until the registry shows it closed. It returns the command id.
func sentToVanishingSession(t *testing.T, e *testenv.Env, db *store.DB, n *testenv.Node, kind string) string {
	t.Helper()
	s, cancel := welcomedSession(t, e.CP.GatewayAddr, n, n.BootID())
	defer cancel()
	c, err := e.Client.CreateCommand(context.Background(), n.NodeID(), kind, nil)
	if err != nil {
		t.Fatal(err)
	}
	for {
		m, err := s.Recv()
		if err != nil {
			t.Fatalf("waiting for command %s: %v", c.ID, err)
		}
		if m.GetCommand().GetId() == c.ID {
			break
		}
	}
	pollUntil(t, "command "+c.ID+" recorded sent", func() bool {
		got, err := e.CP.Commands.Get(context.Background(), iam.RootScope(), c.ID)
		if err != nil {
			t.Fatal(err)
		}
		return got.State == commands.StateSent
	})
	cancel()
	pollUntil(t, "raw session closed in the registry", func() bool { return sessionClosed(t, db, n.NodeID()) })
	return c.ID
}

// welcomedSession opens a raw Session on addr with n's certificate, says
// Hello with bootID and waits for the Welcome. cancel ends the stream; the
// connection closes when the test ends.
func welcomedSession(t *testing.T, addr string, n *testenv.Node, bootID string) (nodev1.Gateway_SessionClient, context.CancelFunc) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(clientTLS(t, n))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), testenv.WaitTimeout)
	s, err := nodev1.NewGatewayClient(conn).Session(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if err := s.Send(&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Hello{Hello: &nodev1.Hello{NodeId: n.NodeID(), BootId: bootID}}}); err != nil {
		cancel()
		t.Fatal(err)
	}
	if m, err := s.Recv(); err != nil || m.GetWelcome() == nil {
		cancel()
		t.Fatalf("welcome: %v %v", m, err)
	}
	return s, cancel
}
