package integration

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/internalv1"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// renewProof signs a renewal proof for csr with key, as the daemon does
// with its current node key.
func renewProof(t *testing.T, key *ecdsa.PrivateKey, csr []byte) []byte {
	t.Helper()
	digest := sha256.Sum256(append([]byte(wire.RenewSigContext), csr...))
	sig, err := ecdsa.SignASN1(rand.Reader, key, digest[:])
	if err != nil {
		t.Fatal(err)
	}
	return sig
}

// countReason counts the recorded events of typ with reason.
func countReason(t *testing.T, e *testenv.Env, typ, reason string) int {
	t.Helper()
	n := 0
	for _, ev := range events(t, e, typ) {
		if ev.Details["reason"] == reason {
			n++
		}
	}
	return n
}

// TestRenewNeedsProofOfPossession: a node's certificate chain is public
// (every gateway sees it in the handshake), so a renewal must also carry
// the node's signature with its current key over the CSR. A compromised
// gateway-only process that forwards a node's chain with a CSR and proof
// of its own key over the internal channel, a client relayed through a
// gateway-only process with a bad proof, and a client of the in-process
// gateway without a proof or with another key's are all refused
// ACCESS_DENIED (renew-proof-invalid) and nothing is issued; the daemon's
// own renewal through the gateway-only process still works.
func TestRenewNeedsProofOfPossession(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx, cancel := context.WithTimeout(context.Background(), testenv.WaitTimeout)
		defer cancel()
		gw := e.StartGateway(t)
		tok, err := e.CP.Nodes.CreateJoinToken(ctx, admin, pki.RoleNode, "victim", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(t.TempDir(), "victim")
		if _, err := daemon.Join(ctx, daemon.JoinOptions{DataDir: dir, Gateway: gw.GatewayAddr, Token: tok.Token, Name: "victim"}); err != nil {
			t.Fatalf("join through the gateway-only process: %v", err)
		}
		n := e.OpenNodeAt(t, dir, "", gw.GatewayAddr)
		nodeCert, err := n.ClientCertificate()
		if err != nil {
			t.Fatal(err)
		}
		nodeChain := nodeCert.Certificate // public: what any gateway sees
		attacker, _ := pki.NewNodeKey()
		attackerCSR, _ := pki.CSR(attacker, n.NodeID())
		const reason = nodes.ReasonRenewProofInvalid
		refusals := 0
		refused := func(t *testing.T, what string, err error, want codes.Code) {
			t.Helper()
			if status.Code(err) != want || status.Convert(err).Message() != string(errs.AccessDenied) {
				t.Fatalf("%s: %v, want %v ACCESS_DENIED", what, err, want)
			}
			refusals++
			if got := countReason(t, e, nodes.EventRenewRefused, reason); got != refusals {
				t.Fatalf("%s: %d %s refusals recorded, want %d", what, got, reason, refusals)
			}
			if certs := certsOf(t, db, n.NodeID()); len(certs) != 1 {
				t.Fatalf("%s: the node has %d certificates, want only its first: %v", what, len(certs), certs)
			}
		}

		t.Run("compromised gateway forwards the node's chain with its own key", func(t *testing.T) {
			files := e.GatewayFiles(t)
			gwCert, err := pki.LoadGatewayCert(filepath.Join(files, pki.GatewayCertFile), filepath.Join(files, pki.GatewayKeyFile))
			if err != nil {
				t.Fatal(err)
			}
			conn, err := grpc.NewClient(e.CP.InternalAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
				MinVersion: tls.VersionTLS13, InsecureSkipVerify: true, Certificates: []tls.Certificate{gwCert}})))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			c := internalv1.NewGatewayServicesClient(conn)
			_, err = c.Renew(ctx, &internalv1.RenewRequest{NodeChainDer: nodeChain, CsrDer: attackerCSR, Proof: renewProof(t, attacker, attackerCSR)})
			refused(t, "relayed renewal proved by the gateway's own key", err, codes.PermissionDenied)
			_, err = c.Renew(ctx, &internalv1.RenewRequest{NodeChainDer: nodeChain, CsrDer: attackerCSR})
			refused(t, "relayed renewal without a proof", err, codes.PermissionDenied)
		})

		// A client that holds the node's TLS key but sends another key's
		// proof, through the gateway-only process and through the api's
		// own gateway: the same refusal either way.
		call := func(t *testing.T, addr string, req *nodev1.RenewRequest) error {
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
				MinVersion: tls.VersionTLS13, InsecureSkipVerify: true, Certificates: []tls.Certificate{*nodeCert}})))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_, err = nodev1.NewGatewayClient(conn).Renew(ctx, req)
			return err
		}
		t.Run("through the gateway-only process", func(t *testing.T) {
			err := call(t, gw.GatewayAddr, &nodev1.RenewRequest{CsrDer: attackerCSR, Proof: renewProof(t, attacker, attackerCSR)})
			refused(t, "renewal with another key's proof via the gateway-only process", err, codes.PermissionDenied)
		})
		t.Run("in-process gateway", func(t *testing.T) {
			err := call(t, e.CP.GatewayAddr, &nodev1.RenewRequest{CsrDer: attackerCSR})
			refused(t, "renewal without a proof via the in-process gateway", err, codes.PermissionDenied)
			err = call(t, e.CP.GatewayAddr, &nodev1.RenewRequest{CsrDer: attackerCSR, Proof: renewProof(t, attacker, attackerCSR)})
			refused(t, "renewal with another key's proof via the in-process gateway", err, codes.PermissionDenied)
		})

		t.Run("the node's own renewal through the gateway-only process", func(t *testing.T) {
			conn, err := n.Dial()
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			before := n.Serial()
			if err := n.Renew(ctx, conn); err != nil {
				t.Fatalf("renew through the gateway-only process: %v", err)
			}
			if n.Serial() == before {
				t.Fatal("renewal kept the serial")
			}
			if certs := certsOf(t, db, n.NodeID()); len(certs) != 2 {
				t.Fatalf("the node has %d certificates after its renewal, want 2: %v", len(certs), certs)
			}
		})
	})
}

// TestRenewRacingQuarantineIsRefused: a renewal that read its
// certificate's state before a quarantine (every certificate of the node
// revoked under the node's lock) committed must not insert a fresh,
// unrevoked certificate after it: the revocation is read again under the
// node's lock. On PostgreSQL the quarantine's transaction holds the node
// lock and its revocation uncommitted while the renewal starts; it commits
// once the renewal waits for that lock. SQLite serialises writers, so there
// the renewal follows the quarantine.
func TestRenewRacingQuarantineIsRefused(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx, cancel := context.WithTimeout(context.Background(), testenv.WaitTimeout)
		defer cancel()
		n := e.Join(t, pki.RoleNode, "racer") // never started: nothing else takes its lock
		id := pki.NodeIdentity{TrustDomain: e.Bundle.TrustDomain, NodeID: n.NodeID(), Role: pki.RoleNode, Serial: n.Serial()}
		key, _ := pki.NewNodeKey()
		csr, _ := pki.CSR(key, n.NodeID())
		const revoke = `UPDATE node_certs SET revoked_at = $1, revoke_reason = $2 WHERE node_id = $3 AND revoked_at IS NULL`

		var err error
		if db.Dialect == store.Postgres {
			tx, berr := db.BeginTx(ctx, nil)
			if berr != nil {
				t.Fatal(berr)
			}
			defer func() { _ = tx.Rollback() }()
			var pid int
			if err := tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				t.Fatal(err)
			}
			var locked string
			if err := tx.QueryRowContext(ctx, `SELECT id FROM nodes WHERE id = $1 FOR UPDATE`, n.NodeID()).Scan(&locked); err != nil {
				t.Fatal(err)
			}
			if _, err := tx.ExecContext(ctx, revoke, e.Clock.Now().UnixMilli(), nodes.ReasonDuplicateIdentity, n.NodeID()); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				_, err := e.CP.Nodes.Renew(ctx, id, csr)
				done <- err
			}()
			// The renewal has read the (still unrevoked) certificate and
			// waits for the node's lock the quarantine holds.
			pollUntil(t, "the renewal waits for the node lock", func() bool {
				var waiting int
				if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid)) AND query LIKE '%FROM nodes WHERE id%FOR UPDATE%'`, pid).Scan(&waiting); err != nil {
					t.Fatal(err)
				}
				return waiting > 0
			})
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			err = <-done
		} else {
			if _, err := db.ExecContext(ctx, revoke, e.Clock.Now().UnixMilli(), nodes.ReasonDuplicateIdentity, n.NodeID()); err != nil {
				t.Fatal(err)
			}
			_, err = e.CP.Nodes.Renew(ctx, id, csr)
		}
		if errs.CodeOf(err) != errs.AccessDenied {
			t.Fatalf("renewal racing the quarantine: %v, want ACCESS_DENIED", err)
		}
		for serial, reason := range certsOf(t, db, n.NodeID()) {
			if reason == "" {
				t.Fatalf("certificate %s of the quarantined node is unrevoked (all: %v)", serial, certsOf(t, db, n.NodeID()))
			}
		}
		if db.Dialect == store.Postgres && !hasReason(t, e, nodes.EventRenewRefused, "certificate-revoked") {
			t.Fatal("the renewal refused under the lock is not recorded as certificate-revoked")
		}
	})
}
