package integration

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// joinRecord reads a node's join record as on disk: the raw bytes, the
// record and its decoded trust bundle.
func joinRecord(t *testing.T, dir string) ([]byte, daemon.JoinRecord, pki.TrustBundle) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "join.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rec daemon.JoinRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	tb, err := pki.DecodeTrustBundle(rec.BundleBody)
	if err != nil {
		t.Fatalf("join record's bundle: %v", err)
	}
	return raw, rec, tb
}

// rawOf returns the DER of certs.
func rawOf(certs []*x509.Certificate) [][]byte {
	out := make([][]byte, len(certs))
	for i, c := range certs {
		out[i] = c.Raw
	}
	return out
}

func sameDERs(t *testing.T, what string, got, want [][]byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d roots, want %d", what, len(got), len(want))
	}
	for i := range got {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("%s: root %d differs from the control plane's", what, i)
		}
	}
}

// rotateStep runs one rotation step on the environment's PKI and restarts
// the control plane with it; the node refreshes on its next session.
func rotateStep(t *testing.T, e *testenv.Env, step func(dir string) (*pki.Bundle, error)) {
	t.Helper()
	if _, err := step(e.PKIDir()); err != nil {
		t.Fatalf("rotation step: %v", err)
	}
	e.Restart(t)
}

// A node joined before a command-root rotation learns the staged root by
// refreshing its trust bundle after the control plane restarts, and once
// the new root is active runs a command signed by a worker key it certified.
func TestBundleRefreshCommandRootRotation(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		n := e.Nodes[0]
		if _, _, tb := joinRecord(t, n.Dir); len(tb.CommandRoots) != 1 {
			t.Fatalf("joined with %d command roots", len(tb.CommandRoots))
		}
		rotateStep(t, e, func(dir string) (*pki.Bundle, error) {
			return pki.RotateStage(dir, e.KEK, pki.KindCommandRoot, e.Clock)
		})
		if err := n.WaitRefresh(t); err != nil {
			t.Fatalf("refresh after stage: %v", err)
		}
		_, _, tb := joinRecord(t, n.Dir)
		sameDERs(t, "command roots after stage", tb.CommandRoots, rawOf(e.Bundle.CommandRoots()))
		if len(tb.CommandRoots) != 2 {
			t.Fatalf("after stage the record lists %d command roots, want 2", len(tb.CommandRoots))
		}

		rotateStep(t, e, func(dir string) (*pki.Bundle, error) {
			return pki.RotateActivate(dir, e.KEK, pki.KindCommandRoot, e.Clock)
		})
		if err := n.WaitRefresh(t); err != nil {
			t.Fatalf("refresh after activate: %v", err)
		}
		_, _, tb = joinRecord(t, n.Dir)
		sameDERs(t, "command roots after activate", tb.CommandRoots, rawOf(e.Bundle.CommandRoots()))
		// e.Bundle is the reloaded bundle: its active command root is the
		// new one, and WorkerSigner certifies a worker key under it.
		if bytes.Equal(tb.CommandRoots[1], e.Bundle.CommandRoot.Raw) || !bytes.Equal(tb.CommandRoots[0], e.Bundle.CommandRoot.Raw) {
			t.Fatal("the active command root is not the new one")
		}
		id := e.InjectCommand(t, n.NodeID(), e.Body(n.NodeID(), "diag.run"), e.WorkerSigner(t))
		if c := e.WaitCommand(t, id); c.State != commands.StateSucceeded {
			t.Fatalf("command under the new root: %s %s", c.State, c.Reason)
		}
		// A command created through the API is signed by the workers, now
		// with a key certified by the new root.
		c, err := e.Client.CreateCommand(context.Background(), n.NodeID(), "diag.run", nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := e.WaitCommand(t, c.ID); got.State != commands.StateSucceeded {
			t.Fatalf("API command after activation: %s %s", got.State, got.Reason)
		}
	})
}

// After an internal-CA rotation the gateway's certificate chains to the
// new internal CA: a node that refreshed while the new CA was staged
// reconnects, and the same node's files from before the refresh cannot
// even complete a TLS handshake with the gateway.
func TestBundleRefreshInternalCARotation(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		n := e.Nodes[0]
		stale := copyNodeDir(t, n.Dir) // the node's files as joined, never refreshed
		rotateStep(t, e, func(dir string) (*pki.Bundle, error) {
			return pki.RotateStage(dir, e.KEK, pki.KindInternalCA, e.Clock)
		})
		if err := n.WaitRefresh(t); err != nil {
			t.Fatalf("refresh after stage: %v", err)
		}
		if _, _, tb := joinRecord(t, n.Dir); len(tb.ServerRoots) != 2 {
			t.Fatalf("after stage the record lists %d server roots, want 2", len(tb.ServerRoots))
		}
		rotateStep(t, e, func(dir string) (*pki.Bundle, error) {
			return pki.RotateActivate(dir, e.KEK, pki.KindInternalCA, e.Clock)
		})
		// A refresh runs only after a session's Hello succeeded, over a
		// connection whose gateway certificate verified: the node is back.
		if err := n.WaitRefresh(t); err != nil {
			t.Fatalf("refresh after activate: %v", err)
		}
		n.WaitConnected(t)
		gatewayIssuedByNewCA(t, e)

		old := e.OpenNode(t, stale, "")
		defer old.Close()
		conn, err := old.Dial()
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), testenv.WaitTimeout)
		defer cancel()
		_, err = nodev1.NewGatewayClient(conn).Bundle(ctx, &nodev1.BundleRequest{})
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "gateway certificate does not verify") {
			t.Fatalf("unrefreshed node reached the gateway: %v", err)
		}
	})
}

// gatewayIssuedByNewCA checks that the gateway's certificate is signed by
// the active (new) internal CA and not by the previous one.
func gatewayIssuedByNewCA(t *testing.T, e *testenv.Env) {
	t.Helper()
	c, err := tls.Dial("tcp", e.CP.GatewayAddr, &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}) // only the certificate is read
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	leaf := c.ConnectionState().PeerCertificates[0]
	roots := e.Bundle.InternalRoots()
	if leaf.CheckSignatureFrom(e.Bundle.InternalCA) != nil || leaf.CheckSignatureFrom(roots[len(roots)-1]) == nil {
		t.Fatal("the gateway's certificate is not issued by the new internal CA")
	}
}

// joinWith joins a new node with token, as bcd join does.
func joinWith(t *testing.T, e *testenv.Env, token string) string {
	t.Helper()
	dir := filepath.Join(e.Dir, "nodes", "by-token-"+strings.Split(token, ".")[2])
	if _, err := daemon.Join(context.Background(), daemon.JoinOptions{DataDir: dir, Gateway: e.CP.GatewayAddr, Token: token}); err != nil {
		t.Fatalf("join: %v", err)
	}
	return dir
}

// A node joined under the old join key refreshes through a join-key
// rotation: the staged bundle (signed by the old key, listing both) and
// after activation and retirement a bundle signed by the new key alone. A
// token made before activation, which pins the old key, still joins after
// it, through the old key's signature among other_signatures.
func TestBundleRefreshJoinKeyRotation(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		n := e.Nodes[0]
		oldKey := e.Bundle.JoinKey
		rotateStep(t, e, func(dir string) (*pki.Bundle, error) { return pki.RotateStage(dir, e.KEK, pki.KindJoinKey, e.Clock) })
		if err := n.WaitRefresh(t); err != nil {
			t.Fatalf("refresh after stage: %v", err)
		}
		_, rec, tb := joinRecord(t, n.Dir)
		if len(tb.JoinKeys) != 2 || !bytes.Equal(rec.JoinPublicKey, oldKey) {
			t.Fatalf("after stage: %d join keys, signer new=%v", len(tb.JoinKeys), !bytes.Equal(rec.JoinPublicKey, oldKey))
		}
		tok, err := e.CP.Nodes.CreateJoinToken(context.Background(), audit.Entry{TenantID: iam.RootTenant, Actor: "test"}, pki.RoleNode, "", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		rotateStep(t, e, func(dir string) (*pki.Bundle, error) { return pki.RotateActivate(dir, e.KEK, pki.KindJoinKey, e.Clock) })
		if err := n.WaitRefresh(t); err != nil {
			t.Fatalf("refresh after activate: %v", err)
		}
		newKey := e.Bundle.JoinKey
		lateDir := joinWith(t, e, tok.Token)
		if _, rec, _ := joinRecord(t, lateDir); !bytes.Equal(rec.JoinPublicKey, oldKey) {
			t.Fatal("the pre-activation token's join did not verify with the old key")
		}
		late := e.OpenNode(t, lateDir, "")
		late.Start(t)
		late.WaitConnected(t)

		rotateStep(t, e, func(dir string) (*pki.Bundle, error) { return pki.RotateRetire(dir, pki.KindJoinKey, e.Clock, true) })
		for _, node := range []*testenv.Node{n, late} {
			if err := node.WaitRefresh(t); err != nil {
				t.Fatalf("refresh after retire: %v", err)
			}
			_, rec, tb := joinRecord(t, node.Dir)
			if len(tb.JoinKeys) != 0 || !bytes.Equal(rec.JoinPublicKey, newKey) {
				t.Fatalf("after retire: %d join keys, signed by the new key %v", len(tb.JoinKeys), bytes.Equal(rec.JoinPublicKey, newKey))
			}
		}
		// The refreshed record loads again (its pin is the new key's).
		n.Stop()
		again := e.OpenNode(t, n.Dir, "")
		again.Start(t)
		again.WaitConnected(t)
	})
}

// signedBy signs tb's canonical encoding with key alone.
func signedBy(t *testing.T, tb pki.TrustBundle, key ed25519.PrivateKey) *nodev1.SignedTrustBundle {
	t.Helper()
	body, err := pki.EncodeTrustBundle(tb)
	if err != nil {
		t.Fatal(err)
	}
	return &nodev1.SignedTrustBundle{Body: body, Signature: pki.SignTrustBundle(key, body), JoinPublicKey: key.Public().(ed25519.PublicKey)}
}

// A node refuses, by exact error, an offered bundle signed only by a join
// key it does not pin, one signed by the real join key that changes the
// approvers or the deployment, and a replayed older bundle; its join
// record is unchanged by each.
func TestBundleRefreshRefusals(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		n := e.Nodes[0]
		_, oldRec, _ := joinRecord(t, n.Dir)
		older := &nodev1.SignedTrustBundle{Body: oldRec.BundleBody, Signature: oldRec.BundleSig, JoinPublicKey: oldRec.JoinPublicKey}
		rotateStep(t, e, func(dir string) (*pki.Bundle, error) {
			return pki.RotateStage(dir, e.KEK, pki.KindCommandRoot, e.Clock)
		})
		if err := n.WaitRefresh(t); err != nil {
			t.Fatalf("refresh after stage: %v", err)
		}
		before, _, cur := joinRecord(t, n.Dir)
		joinKey, err := e.Bundle.JoinSigningKey(e.KEK)
		if err != nil {
			t.Fatal(err)
		}
		_, stranger, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		otherApprover, _, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		newer := cur
		newer.IssuedAt++
		approvers := newer
		approvers.Approvers, approvers.Threshold = [][]byte{otherApprover}, 1
		deployment := newer
		deployment.Deployment = "another.deployment"
		for _, c := range []struct {
			name  string
			offer *nodev1.SignedTrustBundle
			want  error
		}{
			{"signed only by an unpinned key", signedBy(t, newer, stranger), daemon.ErrRefreshUnverified},
			{"unpinned key in other_signatures", withOther(signedBy(t, newer, stranger), stranger), daemon.ErrRefreshUnverified},
			{"approvers changed", signedBy(t, approvers, joinKey), pki.ErrBundleChangesPins},
			{"deployment changed", signedBy(t, deployment, joinKey), pki.ErrBundleChangesPins},
			{"older bundle replayed", older, pki.ErrBundleNotNewer},
			{"same bundle again", signedBy(t, cur, joinKey), pki.ErrBundleNotNewer},
			{"undecodable body", &nodev1.SignedTrustBundle{Body: []byte("{}"), Signature: pki.SignTrustBundle(joinKey, []byte("{}")),
				JoinPublicKey: joinKey.Public().(ed25519.PublicKey)}, daemon.ErrRefreshUnverified},
		} {
			if err := n.OfferTrustBundle(c.offer); !errors.Is(err, c.want) {
				t.Fatalf("%s: %v, want %v", c.name, err, c.want)
			}
			if after, _, _ := joinRecord(t, n.Dir); !bytes.Equal(after, before) {
				t.Fatalf("%s: the join record changed", c.name)
			}
		}
		// The control: the same newer bundle signed by the real join key is
		// taken.
		if err := n.OfferTrustBundle(signedBy(t, newer, joinKey)); err != nil {
			t.Fatalf("newer bundle by the pinned key: %v", err)
		}
		if _, _, tb := joinRecord(t, n.Dir); tb.IssuedAt != newer.IssuedAt {
			t.Fatal("the accepted bundle was not written")
		}
	})
}

// withOther adds a signature by key over sb's body to other_signatures.
func withOther(sb *nodev1.SignedTrustBundle, key ed25519.PrivateKey) *nodev1.SignedTrustBundle {
	sb.OtherSignatures = append(sb.OtherSignatures, &nodev1.JoinKeySignature{JoinPublicKey: key.Public().(ed25519.PublicKey), Signature: pki.SignTrustBundle(key, sb.Body)})
	return sb
}

// A connected node asks for the trust bundle every daemon.RefreshInterval
// by its clock, not only when a session starts: a node kept connected to
// a gateway-only process while the api restarts with a staged command
// root learns it on the next tick, and in the same session runs a command
// signed under that root once it is active.
func TestBundleRefreshPeriodic(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		clk := clock.NewFake(time.Now())
		e := testenv.Start(t, db, testenv.Options{Clock: clk})
		gw := e.StartGateway(t)
		joined := e.Join(t, pki.RoleNode, "")
		joined.Close()
		n := e.OpenNodeAt(t, joined.Dir, "", gw.GatewayAddr)
		n.Start(t)
		n.WaitConnected(t)
		if err := n.NextRefresh(t); !errors.Is(err, pki.ErrBundleNotNewer) {
			t.Fatalf("first refresh of the session: %v", err)
		}
		rotateStep(t, e, func(dir string) (*pki.Bundle, error) {
			return pki.RotateStage(dir, e.KEK, pki.KindCommandRoot, e.Clock)
		})
		refreshed := false
		for i := 0; i < 20 && !refreshed; i++ {
			// The ticker was made before the first refresh and is waiting;
			// each tick past the gateway's one-minute bundle cache asks the
			// restarted api (a fetch fails while the gateway's internal
			// channel reconnects: the next tick tries again).
			clk.Advance(daemon.RefreshInterval)
			switch err := n.NextRefresh(t); {
			case err == nil:
				refreshed = true
			case !errors.Is(err, daemon.ErrRefreshFetch) && !errors.Is(err, pki.ErrBundleNotNewer):
				t.Fatalf("periodic refresh: %v", err)
			}
		}
		if !refreshed {
			t.Fatal("no periodic refresh took the staged bundle")
		}
		if !n.Connected() {
			t.Fatal("the session did not survive the refresh")
		}
		if _, _, tb := joinRecord(t, n.Dir); len(tb.CommandRoots) != 2 {
			t.Fatalf("after the periodic refresh the record lists %d command roots", len(tb.CommandRoots))
		}
		// Activate in the PKI directory only, to hold the new root's key;
		// nothing restarts, so the node's session is the one that refreshed.
		b, err := pki.RotateActivate(e.PKIDir(), e.KEK, pki.KindCommandRoot, e.Clock)
		if err != nil {
			t.Fatal(err)
		}
		rootKey, err := b.CommandRootKey(e.KEK)
		if err != nil {
			t.Fatal(err)
		}
		sign := testenv.SignerFromRoot(t, b.CommandRoot, rootKey, b.TrustDomain, clk.Now())
		id := e.InjectCommand(t, n.NodeID(), e.Body(n.NodeID(), "diag.run"), sign)
		if c := e.WaitCommand(t, id); c.State != commands.StateSucceeded {
			t.Fatalf("command under the root learned mid-session: %s %s", c.State, c.Reason)
		}
	})
}
