package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/daemon/journal"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/gateway"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/jointoken"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/revocations/revwire"
	"github.com/bettercompute/bettercompute/internal/server"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

var admin = audit.Entry{TenantID: "root", Actor: "test"}

// events returns the security events of typ.
func events(t *testing.T, e *testenv.Env, typ string) []audit.Event {
	t.Helper()
	evs, err := e.CP.Events.List(context.Background(), typ)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// hasReason reports whether an event of typ carries reason.
func hasReason(t *testing.T, e *testenv.Env, typ, reason string) bool {
	for _, ev := range events(t, e, typ) {
		if ev.Details["reason"] == reason {
			return true
		}
	}
	return false
}

func TestKindNotAllowedForRole(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		n := e.Join(t, pki.RoleNodeTenant, "tenant-box")
		n.Start(t)
		n.WaitConnected(t)
		// The control plane refuses to create it
		// (TestKindNotAllowedForRoleAtCreate); a row forced into the queue,
		// as a compromised database could, is refused by the node itself.
		if _, err := e.Client.CreateCommand(context.Background(), n.NodeID(), "disk.wipe", nil); err == nil {
			t.Fatal("disk.wipe for a node-tenant node was created")
		}
		id := e.InjectCommand(t, n.NodeID(), e.Body(n.NodeID(), "disk.wipe"), e.WorkerSigner(t))
		expectCancelled(t, e, n, id, "disk.wipe", daemon.ReasonKindNotAllowed)
	})
}

func TestAllowedKindsNarrowedAtHello(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		n := e.Nodes[0]
		ctx := context.Background()
		stopNode(t, db, n)
		// In flight: the gateway sends a diag.run on a session that takes it
		// and never answers (a node that went away with it), and records it
		// sent.
		inflight := sentToVanishingSession(t, e, db, n, "diag.run")
		if err := e.CP.Nodes.SetAllowedKinds(ctx, admin, n.Serial(), []string{"node.ping"}); err != nil {
			t.Fatal(err)
		}
		// Queued while the node is away; cancelled when it says Hello.
		queued, err := e.Client.CreateCommand(ctx, n.NodeID(), "diag.run", nil)
		if err != nil {
			t.Fatal(err)
		}
		n2 := e.OpenNode(t, n.Dir, "")
		n2.Start(t)
		n2.WaitConnected(t)
		if c := e.WaitCommand(t, queued.ID); c.State != "cancelled" || c.Reason != "kind-not-allowed" {
			t.Fatalf("queued diag.run: %s %q, want cancelled kind-not-allowed", c.State, c.Reason)
		}
		if c := e.WaitCommand(t, inflight); c.State != "cancelled" || c.Reason != "kind-not-allowed" {
			t.Fatalf("in-flight diag.run: %s %q, want cancelled kind-not-allowed", c.State, c.Reason)
		}
		if runs := n2.Sim.Runs("diag.run"); runs != 0 {
			t.Fatalf("diag.run ran %d times", runs)
		}
		// The gateway cancelled them at Hello: the node never saw them. (Its
		// own refusal would end the same way, but it journals what it
		// refuses first.)
		j, err := os.ReadFile(filepath.Join(n2.Dir, "journal.log"))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		for _, id := range []string{queued.ID, inflight} {
			if bytes.Contains(j, []byte(id)) {
				t.Fatalf("%s reached the node (journaled); want it cancelled by the gateway at Hello", id)
			}
		}
		// Sent after Hello: the node itself refuses it from the Welcome list.
		id := e.InjectCommand(t, n2.NodeID(), e.Body(n2.NodeID(), "diag.run"), e.WorkerSigner(t))
		expectCancelled(t, e, n2, id, "diag.run", daemon.ReasonKindNotAllowed)
		ping, err := e.Client.CreateCommand(ctx, n2.NodeID(), "node.ping", nil)
		if err != nil {
			t.Fatal(err)
		}
		if c := e.WaitCommand(t, ping.ID); c.State != "succeeded" {
			t.Fatalf("node.ping: %s %q", c.State, c.Reason)
		}
	})
}

// TestWelcomeTimeRewoundRefusesCommands: the time a node trusts comes
// from statements the workers sign, which a gateway can only relay; one
// that relays an old statement (more than 5 minutes behind the highest the
// node accepted) gets every command on that session refused
// welcome-time-rewound.
func TestWelcomeTimeRewoundRefusesCommands(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		clk := clock.NewFake(time.Now())
		e := testenv.Start(t, db, testenv.Options{Nodes: 1, Clock: clk})
		n := e.Nodes[0]
		ctx := context.Background()
		// A statement the workers sign now, which a gateway keeps.
		old, err := e.CP.Signer.SignTime(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n.Stop()
		// The node accepts a statement 10 minutes later...
		clk.Advance(10 * time.Minute)
		if _, err := e.CP.Signer.SignTime(ctx); err != nil {
			t.Fatal(err)
		}
		n1 := e.OpenNode(t, n.Dir, "")
		n1.Start(t)
		n1.WaitConnected(t)
		n1.Stop()
		// ...then a gateway relays the earlier one again.
		if _, err := db.ExecContext(ctx, `UPDATE time_statements SET body = $1, signature = $2, signer_cert = $3`, old.Body, old.Signature, old.SignerCertDer); err != nil {
			t.Fatal(err)
		}
		n2 := e.OpenNode(t, n.Dir, "")
		n2.Start(t)
		n2.WaitConnected(t)
		c, err := e.Client.CreateCommand(ctx, n2.NodeID(), "diag.run", nil)
		if err != nil {
			t.Fatal(err)
		}
		expectCancelled(t, e, n2, c.ID, "diag.run", daemon.ReasonClockRewound)
	})
}

func TestJoinRefusalsAreGenericAndRecorded(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		clk := clock.NewFake(time.Now())
		e := testenv.Start(t, db, testenv.Options{Clock: clk})
		ctx := context.Background()
		join := func(token string) error {
			_, err := daemon.Join(ctx, daemon.JoinOptions{DataDir: filepath.Join(t.TempDir(), "n"), Gateway: e.CP.GatewayAddr, Token: token, Name: "x"})
			return err
		}
		expectDenied := func(err error, reason string) {
			t.Helper()
			if status.Code(errors.Unwrap(err)) != codes.PermissionDenied || status.Convert(errors.Unwrap(err)).Message() != "ACCESS_DENIED" {
				t.Fatalf("join: got %v, want ACCESS_DENIED", err)
			}
			if !hasReason(t, e, nodes.EventJoinRefused, reason) {
				t.Fatalf("no %s event with reason %s", nodes.EventJoinRefused, reason)
			}
		}
		tok, err := e.CP.Nodes.CreateJoinToken(ctx, admin, "node", "a", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := join(tok.Token); err != nil {
			t.Fatalf("first join: %v", err)
		}
		expectDenied(join(tok.Token), "token-used")
		var audited int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit_events WHERE action = $1 AND outcome = 'refused' AND tenant_id = 'root'`, nodes.EventJoinRefused).Scan(&audited); err != nil || audited != 1 {
			t.Fatalf("refused join audit rows: %d (%v), want 1", audited, err)
		}

		parsed, _ := jointoken.Parse(tok.Token)
		parsed.Secret = ids.Secret(32)
		expectDenied(join(parsed.String()), "token-unknown")

		short, err := e.CP.Nodes.CreateJoinToken(ctx, admin, "node", "b", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		clk.Advance(2 * time.Minute)
		expectDenied(join(short.Token), "token-expired")
	})
}

// rawSession opens a Session stream with tlsCfg and returns the code of
// the first answer.
func rawSessionCode(t *testing.T, addr string, tlsCfg *tls.Config, nodeID string) codes.Code {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.WaitTimeout)
	defer cancel()
	s, err := nodev1.NewGatewayClient(conn).Session(ctx)
	if err != nil {
		return status.Code(err)
	}
	_ = s.Send(&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Hello{Hello: &nodev1.Hello{NodeId: nodeID, BootId: "b-raw"}}})
	_, err = s.Recv()
	return status.Code(err)
}

func TestSessionNeedsValidClientCertificate(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		// No client certificate at all.
		if got := rawSessionCode(t, e.CP.GatewayAddr, &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}, "nx"); got != codes.Unauthenticated {
			t.Fatalf("no client cert: %v, want Unauthenticated", got)
		}
		if !hasReason(t, e, "security.session.refused", "no-client-certificate") {
			t.Fatal("refusal not recorded")
		}
		// A certificate from another node CA with the same trust domain.
		kek, _ := pki.CreateKEK(filepath.Join(t.TempDir(), "kek"))
		rogue, err := pki.Init(filepath.Join(t.TempDir(), "pki"), e.Bundle.TrustDomain, kek, clock.Real{})
		if err != nil {
			t.Fatal(err)
		}
		caKey, _ := rogue.NodeCAKey(kek)
		key, _ := pki.NewNodeKey()
		csr, _ := pki.CSR(key, "rogue")
		leaf, err := pki.IssueNodeCert(rogue.NodeCA, caKey, csr, rogue.TrustDomain, ids.New("n"), pki.RoleNode, time.Hour, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		cert := tls.Certificate{Certificate: [][]byte{leaf}, PrivateKey: key}
		cfg := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}}
		if got := rawSessionCode(t, e.CP.GatewayAddr, cfg, "nx"); got != codes.Unauthenticated {
			t.Fatalf("rogue CA: %v, want Unauthenticated", got)
		}
		if !hasReason(t, e, "security.session.refused", "certificate-invalid") {
			t.Fatal("rogue CA refusal not recorded")
		}
	})
}

func TestRevocationClosesSessionOnEveryGateway(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		gw2 := e.StartGateway(t)
		n := e.Join(t, pki.RoleNode, "on-gw2")
		n.Stop()
		n2 := e.OpenNodeAt(t, n.Dir, "", gw2.GatewayAddr)
		n2.Start(t)
		n2.WaitConnected(t)
		local := e.Nodes[0]
		for _, x := range []*testenv.Node{local, n2} {
			if _, err := e.CP.Nodes.Revoke(context.Background(), admin, x.NodeID(), "", nodes.ReasonOperator); err != nil {
				t.Fatal(err)
			}
		}
		local.WaitDisconnectedWithin(t, 5*time.Second)
		n2.WaitDisconnectedWithin(t, 5*time.Second)
		// And it stays out: the next Hello is refused.
		if c := rawSessionCode(t, gw2.GatewayAddr, clientTLS(t, n2), n2.NodeID()); c != codes.Unauthenticated {
			t.Fatalf("revoked cert reconnect: %v, want Unauthenticated", c)
		}
	})
}

// clientTLS returns a TLS config presenting the node's current identity.
func clientTLS(t *testing.T, n *testenv.Node) *tls.Config {
	t.Helper()
	cert, err := n.ClientCertificate()
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true, Certificates: []tls.Certificate{*cert}}
}

func TestDuplicateIdentityIsQuarantined(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		a := e.Nodes[0]
		serial := a.Serial()
		// A clone of a's key and certificate on another machine.
		clone := e.OpenNode(t, a.Dir, "b-clone")
		quarantined, stop := e.CP.Bus.Subscribe("certs.revoked")
		defer stop()
		clone.Start(t)
		select {
		case <-quarantined:
		case <-time.After(testenv.WaitTimeout):
			t.Fatal("clone was not quarantined")
		}
		a.WaitDisconnected(t)
		clone.WaitDisconnected(t)
		dups := events(t, e, nodes.EventDuplicateSession)
		if len(dups) != nodes.FlipLimit {
			t.Fatalf("%d duplicate-session events, want %d", len(dups), nodes.FlipLimit)
		}
		for i, ev := range dups {
			if ev.Details["count"] != float64(i+1) || ev.Details["boot_id"] == ev.Details["previous_boot_id"] {
				t.Fatalf("event %d: %v", i, ev.Details)
			}
		}
		q := events(t, e, nodes.EventQuarantined)
		if len(q) != 1 || q[0].Details["serial"] != serial || q[0].Details["count"] != float64(nodes.FlipLimit+1) {
			t.Fatalf("quarantine events: %+v", q)
		}
		st, err := e.CP.Nodes.CertState(context.Background(), serial)
		if err != nil || !st.Revoked {
			t.Fatalf("cert not revoked: %+v %v", st, err)
		}
		var reason string
		if err := db.QueryRowContext(context.Background(), `SELECT revoke_reason FROM node_certs WHERE serial = $1`, serial).Scan(&reason); err != nil || reason != nodes.ReasonDuplicateIdentity {
			t.Fatalf("revoke reason %q (%v), want %s", reason, err, nodes.ReasonDuplicateIdentity)
		}
		if c := rawSessionCode(t, e.CP.GatewayAddr, clientTLS(t, a), a.NodeID()); c != codes.Unauthenticated {
			t.Fatalf("quarantined Hello: %v, want Unauthenticated", c)
		}
		wantFeedEntry(t, e, serial, nodes.ReasonDuplicateIdentity)
	})
}

// wantFeedEntry asserts the revocation feed holds a node-cert entry for
// serial with reason.
func wantFeedEntry(t *testing.T, e *testenv.Env, serial, reason string) {
	t.Helper()
	all, err := e.CP.Revocations.Since(context.Background(), 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	for _, en := range all {
		if en.Kind == revwire.KindNodeCert && en.Subject == serial && en.Reason == reason {
			return
		}
	}
	t.Fatalf("no node-cert entry for %s (%s) in the feed: %+v", serial, reason, all)
}

// A copy of a node's files that presents the boot id the control plane
// shows for the original (nodes.get, duplicate-session events) is still
// another boot: what is shown is only a digest of the original's boot id,
// so the clone is counted and quarantined like any other.
func TestCloneCannotReuseShownBootID(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		a := e.Nodes[0]
		shown, err := e.CP.Nodes.Get(context.Background(), iam.RootScope(), a.NodeID())
		if err != nil || shown.BootID == "" {
			t.Fatalf("nodes.get: %+v %v", shown, err)
		}
		if strings.Contains(shown.BootID, a.BootID()) || shown.BootID != gateway.BootTag(a.BootID()) {
			t.Fatalf("the control plane shows the raw boot id %q", shown.BootID)
		}
		quarantined, stop := e.CP.Bus.Subscribe("certs.revoked")
		defer stop()
		clone := e.OpenNode(t, a.Dir, shown.BootID)
		clone.Start(t)
		select {
		case <-quarantined:
		case <-time.After(testenv.WaitTimeout):
			t.Fatal("a clone presenting the shown boot id was not quarantined")
		}
	})
}

func TestRenewNeedsCurrentCertificate(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		n := e.Nodes[0]
		ctx := context.Background()
		conn, err := n.Dial()
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		before := n.Serial()
		if err := n.Renew(ctx, conn); err != nil {
			t.Fatalf("renew: %v", err)
		}
		if n.Serial() == before {
			t.Fatal("renew kept the serial")
		}
		// Without a client certificate: generic ACCESS_DENIED.
		anon, err := grpc.NewClient(e.CP.GatewayAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true})))
		if err != nil {
			t.Fatal(err)
		}
		defer anon.Close()
		key, _ := pki.NewNodeKey()
		csr, _ := pki.CSR(key, "x")
		_, err = nodev1.NewGatewayClient(anon).Renew(ctx, &nodev1.RenewRequest{CsrDer: csr})
		if status.Code(err) != codes.PermissionDenied || status.Convert(err).Message() != "ACCESS_DENIED" {
			t.Fatalf("anonymous renew: %v", err)
		}
		if !hasReason(t, e, "security.renew.refused", "no-client-certificate") {
			t.Fatal("anonymous renew not recorded")
		}
		// With a revoked certificate: the same answer.
		if _, err := e.CP.Nodes.Revoke(ctx, admin, n.NodeID(), "", nodes.ReasonOperator); err != nil {
			t.Fatal(err)
		}
		n.WaitDisconnected(t)
		conn2, err := n.Dial()
		if err != nil {
			t.Fatal(err)
		}
		defer conn2.Close()
		err = n.Renew(ctx, conn2)
		if status.Code(errors.Unwrap(err)) != codes.PermissionDenied {
			t.Fatalf("revoked renew: %v", err)
		}
		if !hasReason(t, e, "security.renew.refused", "certificate-revoked") {
			t.Fatal("revoked renew not recorded")
		}
	})
}

func TestAttestation(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		clk := clock.NewFake(time.Now())
		e := testenv.Start(t, db, testenv.Options{Nodes: 1, Clock: clk, NodeCertLifetime: time.Hour})
		ctx := context.Background()
		n := e.Nodes[0]

		t.Run("node-tenant never attests", func(t *testing.T) {
			nt := e.Join(t, pki.RoleNodeTenant, "lessee")
			nt.Start(t)
			nt.WaitConnected(t)
			c, err := e.Client.CreateCommand(ctx, nt.NodeID(), "diag.run", nil)
			if err != nil {
				t.Fatal(err)
			}
			got := e.WaitCommand(t, c.ID)
			if got.State != "succeeded" || got.Attested {
				t.Fatalf("node-tenant diag.run: %s attested=%v, want succeeded, not attested", got.State, got.Attested)
			}
		})

		// apply stores an update signed by n for a fresh command, as the
		// gateway does with what a session carries, and returns the row.
		apply := func(t *testing.T, mutate func(*nodev1.CommandUpdate)) commands.Command {
			t.Helper()
			c, err := e.CP.Commands.Create(ctx, admin, n.NodeID(), "diag.run", nil, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, `UPDATE commands SET state = 'sent' WHERE id = $1`, c.ID); err != nil {
				t.Fatal(err)
			}
			raw, err := n.SignUpdate(boundDiagRunUpdate(c.ID, "succeeded", `{"ok":true}`))
			if err != nil {
				t.Fatal(err)
			}
			upd := unmarshalUpdate(t, raw)
			if mutate != nil {
				mutate(upd)
			}
			if _, err := e.CP.Commands.ApplyUpdate(ctx, n.NodeID(), upd); err != nil {
				t.Fatal(err)
			}
			got, err := e.CP.Commands.Get(ctx, iam.RootScope(), c.ID)
			if err != nil {
				t.Fatal(err)
			}
			return got
		}
		n.Stop()
		if got := apply(t, nil); !got.Attested {
			t.Fatal("a good signature did not attest")
		}
		if got := apply(t, func(u *nodev1.CommandUpdate) { u.NodeSig[len(u.NodeSig)-1] ^= 1 }); got.Attested || got.State != "succeeded" {
			t.Fatalf("forged signature: attested=%v state=%s", got.Attested, got.State)
		}
		clk.Advance(time.Hour + 6*24*time.Hour) // expired 6 days ago: still attests
		if got := apply(t, nil); !got.Attested {
			t.Fatal("a certificate expired 6 days ago did not attest")
		}
		clk.Advance(2 * 24 * time.Hour) // expired 8 days ago
		if got := apply(t, nil); got.Attested {
			t.Fatal("a certificate expired 8 days ago attested")
		}
		clk.Advance(-8 * 24 * time.Hour)
		if _, err := e.CP.Nodes.Revoke(ctx, admin, n.NodeID(), "", nodes.ReasonOperator); err != nil {
			t.Fatal(err)
		}
		if got := apply(t, nil); got.Attested {
			t.Fatal("a revoked certificate attested")
		}
	})
}

// One batch of updates from many sessions is recorded exactly as one
// update at a time would be: a command named twice (running, then its
// result) ends in its result, a forged signature is recorded but not
// attested, a final command does not change, and an update naming an
// unknown command or another node is refused.
func TestApplyUpdatesBatch(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 2})
		ctx := context.Background()
		a, b := e.Nodes[0], e.Nodes[1]
		a.Stop()
		b.Stop()
		mk := func(n *testenv.Node) string {
			c, err := e.CP.Commands.Create(ctx, admin, n.NodeID(), "diag.run", nil, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			return c.ID
		}
		upd := func(n *testenv.Node, id, state string) *nodev1.CommandUpdate {
			raw, err := n.SignUpdate(boundDiagRunUpdate(id, state, `{"ok":true}`))
			if err != nil {
				t.Fatal(err)
			}
			return unmarshalUpdate(t, raw)
		}
		twice, forged, final, other := mk(a), mk(a), mk(b), mk(b)
		if _, err := db.ExecContext(ctx, `UPDATE commands SET state = 'failed' WHERE id = $1`, final); err != nil {
			t.Fatal(err)
		}
		bad := upd(b, forged, "succeeded")
		bad.NodeSig[len(bad.NodeSig)-1] ^= 1
		// The forged update comes over b's session but names a's command:
		// refused as another node's (not found for b).
		items := []commands.UpdateItem{
			{NodeID: a.NodeID(), Update: upd(a, twice, "running")},
			{NodeID: a.NodeID(), Update: upd(a, twice, "succeeded")},
			{NodeID: b.NodeID(), Update: upd(b, final, "succeeded")},
			{NodeID: b.NodeID(), Update: upd(b, "c-unknown", "succeeded")},
			{NodeID: a.NodeID(), Update: upd(b, other, "succeeded")},
			{NodeID: b.NodeID(), Update: bad},
		}
		forgedA := upd(a, forged, "succeeded")
		forgedA.NodeSig[len(forgedA.NodeSig)-1] ^= 1
		items = append(items, commands.UpdateItem{NodeID: a.NodeID(), Update: forgedA})
		res := e.CP.Commands.ApplyUpdates(ctx, items)
		want := []struct{ state, code string }{
			{"running", ""}, {"succeeded", ""}, {"failed", ""}, {"", string(errs.NotFound)}, {"", string(errs.AccessDenied)},
			{"", string(errs.NotFound)}, {"succeeded", ""},
		}
		for i, w := range want {
			errOK := w.code == "" && res[i].Err == nil || w.code != "" && string(errs.CodeOf(res[i].Err)) == w.code
			if res[i].State != w.state || !errOK {
				t.Errorf("item %d: state %q err %v, want state %q code %q", i, res[i].State, res[i].Err, w.state, w.code)
			}
		}
		// other's update came over the wrong node's session and changed
		// nothing: it is still waiting for delivery, queued or (when the
		// gateway had not yet seen b's session end) sent.
		for id, w := range map[string]struct {
			state    string
			attested bool
		}{twice: {"succeeded", true}, forged: {"succeeded", false}, final: {"failed", false}, other: {"queued", false}} {
			got, err := e.CP.Commands.Get(ctx, iam.RootScope(), id)
			if id == other && err == nil && got.State == "sent" {
				got.State = "queued"
			}
			if err != nil || string(got.State) != w.state || got.Attested != w.attested {
				t.Errorf("%s: %s attested=%v (%v), want %s attested=%v", id, got.State, got.Attested, err, w.state, w.attested)
			}
		}
	})
}

func TestJournalAfterRestart(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		ctx := context.Background()
		n := e.Nodes[0]
		n.Stop()
		mk := func() commands.Command {
			c, err := e.CP.Commands.Create(ctx, admin, n.NodeID(), "diag.run", nil, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			// It was delivered before the crash.
			if _, err := db.ExecContext(ctx, `UPDATE commands SET state = 'sent' WHERE id = $1`, c.ID); err != nil {
				t.Fatal(err)
			}
			return c
		}
		interrupted, offline := mk(), mk()
		j, err := journal.Open(filepath.Join(n.Dir, "journal.log"), time.Now(), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		// Crashed while running "interrupted"; finished "offline" while the
		// gateway was unreachable.
		emptySum := sha256.Sum256([]byte("{}"))
		if err := j.StartCommand(interrupted.ID, time.Now().Add(time.Hour), "diag.run", emptySum[:]); err != nil {
			t.Fatal(err)
		}
		if err := j.Start(offline.ID, time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		upd, err := n.SignUpdate(boundDiagRunUpdate(offline.ID, "succeeded", `{"offline":true}`))
		if err != nil {
			t.Fatal(err)
		}
		if err := j.Done(offline.ID, time.Now().Add(time.Hour), upd); err != nil {
			t.Fatal(err)
		}
		j.Close()

		n2 := e.OpenNode(t, n.Dir, "")
		n2.Start(t)
		got := e.WaitCommand(t, interrupted.ID)
		if got.State != "failed" || got.Reason != "interrupted" || !got.Attested {
			t.Fatalf("interrupted: %s %q attested=%v, want failed interrupted attested", got.State, got.Reason, got.Attested)
		}
		got = e.WaitCommand(t, offline.ID)
		if got.State != "succeeded" || !got.Attested || string(got.Result) != `{"offline":true}` {
			t.Fatalf("offline result: %s attested=%v result=%s", got.State, got.Attested, got.Result)
		}
		if runs := n2.Sim.Runs("diag.run"); runs != 0 {
			t.Fatalf("diag.run ran %d times after restart, want 0", runs)
		}
	})
}

func TestWorkerKeyRotates(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		clk := clock.NewFake(time.Now())
		e := testenv.Start(t, db, testenv.Options{Nodes: 1, Clock: clk})
		ctx := context.Background()
		start := clk.Now()
		k1, err := e.CP.Signer.CurrentKey(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// The key is certified, and stored, for exactly 24 h from its
		// making (the certificate's times have whole seconds).
		var certDER []byte
		var notAfterMS int64
		if err := db.QueryRowContext(ctx, `SELECT cert_der, not_after FROM worker_keys WHERE id = $1`, k1).Scan(&certDER, &notAfterMS); err != nil {
			t.Fatal(err)
		}
		cert, err := x509.ParseCertificate(certDER)
		if err != nil {
			t.Fatal(err)
		}
		if want := start.Add(24 * time.Hour); !cert.NotAfter.Equal(want.Truncate(time.Second)) || notAfterMS != want.UnixMilli() {
			t.Fatalf("worker key lifetime: certificate until %s, stored until %d, want %s", cert.NotAfter, notAfterMS, want)
		}
		// No rotation while more than 12 h remain: one second more than
		// 12 h left keeps the key.
		clk.Advance(12*time.Hour - time.Second)
		if k, err := e.CP.Signer.CurrentKey(ctx); err != nil || k != k1 {
			t.Fatalf("with 12h01s left: key %s (%v), want %s kept", k, err, k1)
		}
		// One second less than 12 h left rotates it.
		clk.Advance(2 * time.Second)
		k2, err := e.CP.Signer.CurrentKey(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if k1 == k2 {
			t.Fatal("worker key did not rotate with 11h59m59s left")
		}
		c, err := e.Client.CreateCommand(ctx, e.Nodes[0].NodeID(), "node.ping", nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := e.WaitCommand(t, c.ID); got.State != "succeeded" || !got.Attested {
			t.Fatalf("after rotation: %s %q", got.State, got.Reason)
		}
	})
}

func unmarshalUpdate(t *testing.T, raw []byte) *nodev1.CommandUpdate {
	t.Helper()
	var u nodev1.CommandUpdate
	if err := proto.Unmarshal(raw, &u); err != nil {
		t.Fatal(err)
	}
	return &u
}

// On PostgreSQL, pokes cross processes through NOTIFY: with the second
// gateway's polling slowed to an hour, a command signed in the first
// process still reaches a node on the second at once, and a revocation
// still closes its session at once.
func TestCrossProcessPokesOverPostgres(t *testing.T) {
	db := storetest.NewTestPostgres(t)
	e := testenv.Start(t, db, testenv.Options{})
	gw2 := e.StartGatewayWith(t, func(o *server.Options) { o.CommandPoll, o.RevocationPoll = time.Hour, time.Hour })
	n := e.Join(t, pki.RoleNode, "far")
	n.Stop()
	n2 := e.OpenNodeAt(t, n.Dir, "", gw2.GatewayAddr)
	n2.Start(t)
	n2.WaitConnected(t)
	c, err := e.Client.CreateCommand(context.Background(), n2.NodeID(), "node.ping", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.WaitCommand(t, c.ID); got.State != "succeeded" || !got.Attested {
		t.Fatalf("command through the other process's gateway: %s %q", got.State, got.Reason)
	}
	if _, err := e.CP.Nodes.Revoke(context.Background(), admin, n2.NodeID(), "", nodes.ReasonOperator); err != nil {
		t.Fatal(err)
	}
	n2.WaitDisconnectedWithin(t, 5*time.Second)
}

// A session lives no longer than its certificate: the gateway closes it
// UNAUTHENTICATED when the certificate expires.
func TestSessionClosesWhenCertificateExpires(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{NodeCertLifetime: 2 * time.Second})
	n := e.Join(t, pki.RoleNode, "short-lived")
	s, cancel := welcomedSession(t, e.CP.GatewayAddr, n, "b-expiry")
	defer cancel()
	for {
		_, err := s.Recv()
		if err == nil {
			continue
		}
		if status.Code(err) != codes.Unauthenticated {
			t.Fatalf("session ended with %v, want Unauthenticated at certificate expiry", err)
		}
		return
	}
}

// TestRestartedGatewayClosesStaleSessionsBeforeServing: a gateway that
// restarts marks closed the sessions its earlier run left open in the
// registry (a crash wrote no close), and it does so before it serves, not
// concurrently: a node that connects at once must not have its new session
// closed under it (it would look disconnected, and placement would refuse
// it, while its session is up). The stopped node's session row is made
// open again, as a crash leaves it; right after the restart returns, the
// registry shows it closed, and a node that connects stays connected.
func TestRestartedGatewayClosesStaleSessionsBeforeServing(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 2})
		ctx := context.Background()
		stale, live := e.Nodes[0], e.Nodes[1]
		stale.Stop()
		live.Stop()
		waitDisconnectedInRegistry(t, e, stale.NodeID())
		waitDisconnectedInRegistry(t, e, live.NodeID())
		if _, err := db.ExecContext(ctx, `UPDATE node_sessions SET closed_at = NULL WHERE node_id = $1`, stale.NodeID()); err != nil {
			t.Fatal(err)
		}
		if n, err := e.CP.Nodes.Get(ctx, iam.RootScope(), stale.NodeID()); err != nil || !n.Connected {
			t.Fatalf("setup: %+v %v, want the crashed session open", n, err)
		}
		e.Restart(t)
		if n, err := e.CP.Nodes.Get(ctx, iam.RootScope(), stale.NodeID()); err != nil || n.Connected {
			t.Fatalf("after restart: connected=%v (%v), want the stale session closed before the gateway serves", n.Connected, err)
		}
		n2 := e.OpenNode(t, live.Dir, "")
		n2.Start(t)
		n2.WaitConnected(t)
		if n, err := e.CP.Nodes.Get(ctx, iam.RootScope(), live.NodeID()); err != nil || !n.Connected {
			t.Fatalf("reconnected node: connected=%v (%v), want connected", n.Connected, err)
		}
	})
}
