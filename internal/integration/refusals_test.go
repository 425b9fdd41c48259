package integration

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// expectCancelled waits for command id and checks it was refused on the
// node with reason, and that the sim driver ran nothing.
func expectCancelled(t *testing.T, e *testenv.Env, n *testenv.Node, id, kind, reason string) {
	t.Helper()
	c := e.WaitCommand(t, id)
	if c.State != "cancelled" || c.Reason != reason {
		t.Fatalf("command %s: state %q reason %q, want cancelled %q", id, c.State, c.Reason, reason)
	}
	if runs := n.Sim.Runs(kind); runs != 0 {
		t.Fatalf("%s ran %d times on the node, want 0", kind, runs)
	}
}

// expectIgnored waits until node n counted one more refusal with reason
// than before, and checks that the command was neither run nor answered:
// a message nobody signed for its id leaves no update (so it stays sent,
// not cancelled) and the sim driver ran nothing.
func expectIgnored(t *testing.T, e *testenv.Env, n *testenv.Node, before map[string]int, id, kind, reason string) {
	t.Helper()
	deadline := time.Now().Add(testenv.WaitTimeout)
	for n.Refusals()[reason] <= before[reason] {
		if time.Now().After(deadline) {
			t.Fatalf("node did not refuse %s with %q within %v (refusals %v)", id, reason, testenv.WaitTimeout, n.Refusals())
		}
		time.Sleep(10 * time.Millisecond)
	}
	c, err := e.CP.Commands.Get(context.Background(), iam.RootScope(), id)
	if err != nil {
		t.Fatal(err)
	}
	if c.State == "cancelled" || c.State == "succeeded" || c.State == "failed" || c.Reason != "" {
		t.Fatalf("command %s: state %q reason %q, want no answer from the node", id, c.State, c.Reason)
	}
	if runs := n.Sim.Runs(kind); runs != 0 {
		t.Fatalf("%s ran %d times on the node, want 0", kind, runs)
	}
}

// TestNodeRefusesForgedCommands injects commands the way a compromised
// database or gateway could, and checks bcd refuses each with its reason.
func TestNodeRefusesForgedCommands(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 2})
		a, b := e.Nodes[0], e.Nodes[1]
		good := e.WorkerSigner(t)

		t.Run("signature-missing", func(t *testing.T) {
			before := a.Refusals()
			id := e.InjectCommand(t, a.NodeID(), e.Body(a.NodeID(), "disk.wipe"), nil)
			expectIgnored(t, e, a, before, id, "disk.wipe", daemon.ReasonSignatureMissing)
		})
		t.Run("signature-invalid", func(t *testing.T) {
			flip := func(body []byte) ([]byte, []byte) {
				sig, cert := good(body)
				sig[0] ^= 1
				return sig, cert
			}
			before := a.Refusals()
			id := e.InjectCommand(t, a.NodeID(), e.Body(a.NodeID(), "disk.wipe"), flip)
			expectIgnored(t, e, a, before, id, "disk.wipe", daemon.ReasonSignatureInvalid)
		})
		t.Run("body-altered-after-signing", func(t *testing.T) {
			// A worker signed a node.ping; the row now holds a disk.wipe body
			// with that signature.
			body := e.Body(a.NodeID(), "disk.wipe")
			before := a.Refusals()
			id := e.InjectCommand(t, a.NodeID(), body, func([]byte) ([]byte, []byte) {
				signed := proto.Clone(body).(*nodev1.CommandBody)
				signed.Kind = "node.ping"
				raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(signed)
				if err != nil {
					t.Fatal(err)
				}
				return good(raw)
			})
			expectIgnored(t, e, a, before, id, "disk.wipe", daemon.ReasonSignatureInvalid)
		})
		t.Run("signer-untrusted", func(t *testing.T) {
			rogueKEK, err := pki.CreateKEK(filepath.Join(t.TempDir(), "kek"))
			if err != nil {
				t.Fatal(err)
			}
			rogue, err := pki.Init(filepath.Join(t.TempDir(), "pki"), e.Bundle.TrustDomain, rogueKEK, clock.Real{})
			if err != nil {
				t.Fatal(err)
			}
			rk, err := rogue.CommandRootKey(rogueKEK)
			if err != nil {
				t.Fatal(err)
			}
			sign := testenv.SignerFromRoot(t, rogue.CommandRoot, rk, rogue.TrustDomain, time.Now())
			before := a.Refusals()
			id := e.InjectCommand(t, a.NodeID(), e.Body(a.NodeID(), "disk.wipe"), sign)
			expectIgnored(t, e, a, before, id, "disk.wipe", daemon.ReasonSignerUntrusted)
		})
		t.Run("wrong-node", func(t *testing.T) {
			id := e.InjectCommand(t, a.NodeID(), e.Body(b.NodeID(), "disk.wipe"), good)
			expectCancelled(t, e, a, id, "disk.wipe", daemon.ReasonWrongNode)
			if b.Sim.Runs("disk.wipe") != 0 {
				t.Fatal("the named node ran it")
			}
		})
		t.Run("expired", func(t *testing.T) {
			body := e.Body(a.NodeID(), "disk.wipe")
			body.IssuedAtMs = time.Now().Add(-2 * time.Hour).UnixMilli()
			body.ExpiresAtMs = time.Now().Add(-time.Hour).UnixMilli()
			rk, err := e.Bundle.CommandRootKey(e.KEK)
			if err != nil {
				t.Fatal(err)
			}
			// A worker key that was valid when the body was issued.
			old := testenv.SignerFromRoot(t, e.Bundle.CommandRoot, rk, e.Bundle.TrustDomain, time.Now().Add(-3*time.Hour))
			id := e.InjectCommand(t, a.NodeID(), body, old)
			expectCancelled(t, e, a, id, "disk.wipe", daemon.ReasonExpired)
		})
		t.Run("not-yet-valid", func(t *testing.T) {
			body := e.Body(a.NodeID(), "disk.wipe")
			body.IssuedAtMs = time.Now().Add(time.Hour).UnixMilli()
			body.ExpiresAtMs = time.Now().Add(2 * time.Hour).UnixMilli()
			id := e.InjectCommand(t, a.NodeID(), body, good)
			expectCancelled(t, e, a, id, "disk.wipe", daemon.ReasonNotYetValid)
		})
		t.Run("replayed", func(t *testing.T) {
			c, err := e.Client.CreateCommand(context.Background(), a.NodeID(), "node.ping", nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := e.WaitCommand(t, c.ID); got.State != "succeeded" {
				t.Fatalf("first run: %s %s", got.State, got.Reason)
			}
			// The database (or a gateway) sends the same signed bytes again.
			if _, err := db.ExecContext(context.Background(), `UPDATE commands SET state = 'queued' WHERE id = $1`, c.ID); err != nil {
				t.Fatal(err)
			}
			e.CP.Bus.Publish("node." + a.NodeID())
			// The node refuses to run it again and answers with the result
			// it journaled the first time, which changes nothing.
			got := e.WaitCommand(t, c.ID)
			if got.State != "succeeded" || !got.Attested || got.Reason != "" {
				t.Fatalf("replay: %s %q attested=%v, want the first answer again (succeeded, attested)", got.State, got.Reason, got.Attested)
			}
			if runs := a.Sim.Runs("node.ping"); runs != 1 {
				t.Fatalf("node.ping ran %d times, want 1", runs)
			}
			if r := a.Refusals(); r[daemon.ReasonReplayed] != 1 {
				t.Fatalf("refusals %v, want one %q", r, daemon.ReasonReplayed)
			}
		})
	})
}
