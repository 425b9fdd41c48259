package integration

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/cli"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/quorum/quorumwire"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

func leavesFor(kind string, payload json.RawMessage, unbound bool, nodes ...string) []client.LeafRequest {
	out := make([]client.LeafRequest, len(nodes))
	for i, n := range nodes {
		out[i] = client.LeafRequest{NodeID: n, Kind: kind, Payload: payload, Unbound: unbound}
	}
	return out
}

func mustBatch(t *testing.T, e *testenv.Env, leaves []client.LeafRequest) client.Batch {
	t.Helper()
	b, err := e.Client.CreateBatch(context.Background(), leaves, 0)
	if err != nil {
		t.Fatalf("create batch: %v", err)
	}
	return b
}

func wantCode(t *testing.T, err error, code string) {
	t.Helper()
	if client.CodeOf(err) != code {
		t.Fatalf("err = %v, want %s", err, code)
	}
}

func dbExec(t *testing.T, db *store.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// TestDestructiveNeedsQuorum is issue 5's "done when" on the real chain: an
// unbatched disk.wipe is refused on the node; with one approval of two the
// command stays unsigned in the queue; with two it runs, attested. The
// control plane accepts approvals only from pinned approvers, each once.
func TestDestructiveNeedsQuorum(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 2})
		a, b := e.Nodes[0], e.Nodes[1]
		ctx := context.Background()
		k := e.ApproverKeys

		t.Run("unbatched-destructive", func(t *testing.T) {
			c, err := e.Client.CreateCommand(ctx, a.NodeID(), "disk.wipe", nil)
			if err != nil {
				t.Fatal(err)
			}
			expectCancelled(t, e, a, c.ID, "disk.wipe", daemon.ReasonUnbatchedDestructive)
		})

		batch := mustBatch(t, e, leavesFor("disk.wipe", nil, false, a.NodeID()))
		if batch.State != "proposed" || batch.Threshold != 2 || len(batch.Leaves) != 1 || batch.Leaves[0].Unbound || batch.Proposer != "proposed by admin" {
			t.Fatalf("batch = %+v", batch)
		}
		e.Approve(t, batch.ID, k[0])

		t.Run("approvals only from pinned approvers, once each", func(t *testing.T) {
			_, rogue, _ := ed25519.GenerateKey(rand.Reader)
			root, _ := hex.DecodeString(batch.Root)
			msg := quorumwire.ApprovalMessage(batch.Deployment, batch.ID, root, batch.ExpiresMS)
			_, err := e.Client.ApproveBatch(ctx, batch.ID, rogue.Public().(ed25519.PublicKey), ed25519.Sign(rogue, msg))
			wantCode(t, err, "ACCESS_DENIED")
			_, err = e.Client.ApproveBatch(ctx, batch.ID, k[0].Public().(ed25519.PublicKey), ed25519.Sign(k[0], msg))
			wantCode(t, err, "CONFLICT")
			_, err = e.Client.ApproveBatch(ctx, batch.ID, k[1].Public().(ed25519.PublicKey), ed25519.Sign(k[1], append(msg, 0)))
			wantCode(t, err, "INVALID_INPUT")
		})

		var cmdID string
		t.Run("one approval of two: held in the queue", func(t *testing.T) {
			c, err := e.Client.CreateCommandInBatch(ctx, a.NodeID(), "disk.wipe", nil, batch.ID)
			if err != nil {
				t.Fatal(err)
			}
			cmdID = c.ID
			if _, err := e.CP.Signer.SignPending(ctx); err != nil {
				t.Fatal(err)
			}
			var unsigned int
			if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM commands WHERE id = $1 AND state = 'queued' AND body IS NULL`, c.ID).Scan(&unsigned); err != nil {
				t.Fatal(err)
			}
			if unsigned != 1 || a.Sim.Runs("disk.wipe") != 0 {
				t.Fatalf("command of a batch with one approval was signed or ran (unsigned=%d)", unsigned)
			}
		})

		t.Run("no leaf for the command", func(t *testing.T) {
			_, err := e.Client.CreateCommandInBatch(ctx, b.NodeID(), "disk.wipe", nil, batch.ID)
			wantCode(t, err, "INVALID_INPUT")
			_, err = e.Client.CreateCommandInBatch(ctx, a.NodeID(), "disk.wipe", json.RawMessage(`{"disks":["nvme0n1"]}`), batch.ID)
			wantCode(t, err, "INVALID_INPUT")
			_, err = e.Client.CreateCommandInBatch(ctx, a.NodeID(), "node.reboot", nil, batch.ID)
			wantCode(t, err, "INVALID_INPUT")
			_, err = e.Client.CreateCommandInBatch(ctx, a.NodeID(), "disk.wipe", nil, "b-none")
			wantCode(t, err, "NOT_FOUND")
		})

		t.Run("two approvals: runs, attested", func(t *testing.T) {
			after := e.Approve(t, batch.ID, k[1])
			if after.State != "approved" {
				t.Fatalf("batch state %s after two approvals", after.State)
			}
			got := e.WaitCommand(t, cmdID)
			if got.State != "succeeded" || !got.Attested || got.BatchID != batch.ID {
				t.Fatalf("command = %s attested=%v reason=%q batch=%q", got.State, got.Attested, got.Reason, got.BatchID)
			}
			if a.Sim.Runs("disk.wipe") != 1 {
				t.Fatalf("disk.wipe ran %d times", a.Sim.Runs("disk.wipe"))
			}
		})

		t.Run("unbound leaf admits any payload and is flagged", func(t *testing.T) {
			ub := mustBatch(t, e, leavesFor("node.reboot", nil, true, a.NodeID()))
			if !ub.Unbound || !ub.Leaves[0].Unbound || ub.Leaves[0].Flag == "" || ub.Leaves[0].PayloadSHA256 != "" {
				t.Fatalf("unbound leaf not flagged: %+v", ub)
			}
			e.Approve(t, ub.ID, k[1], k[2])
			c, err := e.Client.CreateCommandInBatch(ctx, a.NodeID(), "node.reboot", json.RawMessage(`{"reason": "kernel update"}`), ub.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got := e.WaitCommand(t, c.ID); got.State != "succeeded" || !got.Attested {
				t.Fatalf("reboot under unbound leaf: %s %q", got.State, got.Reason)
			}
		})

		t.Run("an agent's batch reads as the agent's", func(t *testing.T) {
			// An agent acting for a person, both bound to admin in root,
			// made through the API: its batch waits for its person, then
			// reads as the agent's, for the person its delegation names.
			_, _, aliceKey, claudeKey := rootAgent(t, e)
			ag := client.New(e.Client.BaseURL, claudeKey)
			leaves := leavesFor("node.reboot", nil, true, b.NodeID())
			_, err := ag.CreateBatch(ctx, leaves, time.Hour)
			id, _ := mustHeld(t, err)
			if err := client.New(e.Client.BaseURL, aliceKey).Call(ctx, "approvals.approve", map[string]any{"id": id}, nil); err != nil {
				t.Fatal(err)
			}
			ab, err := ag.CreateBatch(ctx, leaves, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			if ab.Proposer != "proposed by agent claude for alice" || ab.Agent != "claude" || ab.AgentFor != "alice" {
				t.Fatalf("agent batch proposer = %q (%q, %q)", ab.Proposer, ab.Agent, ab.AgentFor)
			}
			var out bytes.Buffer
			setCLIEnv(t, e)
			if code := cli.Main([]string{"batch", "show", ab.ID}, &out, &out); code != 0 || !strings.Contains(out.String(), "proposed by agent claude for alice") ||
				!strings.Contains(out.String(), "UNBOUND") {
				t.Fatalf("batch show (exit %d):\n%s", code, out.String())
			}
		})
	})
}

// approvedBatch proposes a batch through the API and approves it with the
// first two approver keys.
func approvedBatch(t *testing.T, e *testenv.Env, leaves []client.LeafRequest) client.Batch {
	t.Helper()
	b := mustBatch(t, e, leaves)
	return e.Approve(t, b.ID, e.ApproverKeys[0], e.ApproverKeys[1])
}

// TestNodeRefusesBatchForgeries plays a compromised control plane (its
// database, api or worker) against the node's own checks: each forgery of
// a destructive batch is refused on the node with its reason and nothing runs.
func TestNodeRefusesBatchForgeries(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 2})
		a, b := e.Nodes[0], e.Nodes[1]
		ctx := context.Background()
		good := e.WorkerSigner(t)
		k := e.ApproverKeys

		t.Run("unbatched-destructive", func(t *testing.T) {
			// A worker key signs anything: without a batch it is not enough.
			id := e.InjectCommand(t, a.NodeID(), e.Body(a.NodeID(), "disk.wipe"), good)
			expectCancelled(t, e, a, id, "disk.wipe", daemon.ReasonUnbatchedDestructive)
		})
		t.Run("batch-under-quorum", func(t *testing.T) {
			// k-1 approvals; the database claims the batch is approved.
			bt := mustBatch(t, e, leavesFor("disk.wipe", nil, false, a.NodeID()))
			e.Approve(t, bt.ID, k[0])
			dbExec(t, db, `UPDATE batches SET state = 'approved' WHERE id = $1`, bt.ID)
			c, err := e.Client.CreateCommandInBatch(ctx, a.NodeID(), "disk.wipe", nil, bt.ID)
			if err != nil {
				t.Fatal(err)
			}
			e.CP.Bus.Publish(bus.TopicSign)
			expectCancelled(t, e, a, c.ID, "disk.wipe", daemon.ReasonBatchUnderQuorum)
		})
		t.Run("approver-unpinned", func(t *testing.T) {
			bt := approvedBatch(t, e, leavesFor("disk.wipe", nil, false, a.NodeID()))
			_, rogue, _ := ed25519.GenerateKey(rand.Reader)
			root, _ := hex.DecodeString(bt.Root)
			sig := ed25519.Sign(rogue, quorumwire.ApprovalMessage(bt.Deployment, bt.ID, root, bt.ExpiresMS))
			dbExec(t, db, `INSERT INTO batch_approvals (batch_id, approver_key, signature, submitted_by, created_at) VALUES ($1, $2, $3, 'rogue', 0)`,
				bt.ID, []byte(rogue.Public().(ed25519.PublicKey)), sig)
			c, err := e.Client.CreateCommandInBatch(ctx, a.NodeID(), "disk.wipe", nil, bt.ID)
			if err != nil {
				t.Fatal(err)
			}
			expectCancelled(t, e, a, c.ID, "disk.wipe", daemon.ReasonApproverUnpinned)
		})
		t.Run("batch-expired", func(t *testing.T) {
			// The approvers signed a batch whose expiry has passed.
			bt := mustBatch(t, e, leavesFor("disk.wipe", nil, false, a.NodeID()))
			past := time.Now().Add(-time.Minute).UnixMilli()
			root, _ := hex.DecodeString(bt.Root)
			dbExec(t, db, `UPDATE batches SET expires_at = $1, state = 'approved' WHERE id = $2`, past, bt.ID)
			for _, key := range k[:2] {
				dbExec(t, db, `INSERT INTO batch_approvals (batch_id, approver_key, signature, submitted_by, created_at) VALUES ($1, $2, $3, 'test', 0)`,
					bt.ID, []byte(key.Public().(ed25519.PublicKey)), ed25519.Sign(key, quorumwire.ApprovalMessage(bt.Deployment, bt.ID, root, past)))
			}
			body := e.Body(a.NodeID(), "disk.wipe")
			body.BatchId = bt.ID
			id := e.InjectBatchedCommand(t, a.NodeID(), body, good, bt.ID)
			expectCancelled(t, e, a, id, "disk.wipe", daemon.ReasonBatchExpired)
		})
		t.Run("batch-mismatch", func(t *testing.T) {
			// The signed body names one batch; the approval is another's.
			named := mustBatch(t, e, leavesFor("disk.wipe", nil, false, a.NodeID()))
			other := approvedBatch(t, e, leavesFor("disk.wipe", nil, false, a.NodeID()))
			body := e.Body(a.NodeID(), "disk.wipe")
			body.BatchId = named.ID
			id := e.InjectBatchedCommand(t, a.NodeID(), body, good, other.ID)
			expectCancelled(t, e, a, id, "disk.wipe", daemon.ReasonBatchMismatch)
		})
		t.Run("leaf-not-in-batch", func(t *testing.T) {
			// Approved for node b only; the worker signs a wipe of node a.
			bt := approvedBatch(t, e, leavesFor("disk.wipe", nil, false, b.NodeID()))
			body := e.Body(a.NodeID(), "disk.wipe")
			body.BatchId = bt.ID
			id := e.InjectBatchedCommand(t, a.NodeID(), body, good, bt.ID)
			expectCancelled(t, e, a, id, "disk.wipe", daemon.ReasonLeafNotInBatch)
			if b.Sim.Runs("disk.wipe") != 0 {
				t.Fatal("node b ran a wipe")
			}
		})
		t.Run("leaf-not-in-batch/other payload", func(t *testing.T) {
			// The leaf binds {}; the signed body carries another payload.
			bt := approvedBatch(t, e, leavesFor("disk.wipe", nil, false, a.NodeID()))
			body := e.Body(a.NodeID(), "disk.wipe")
			body.BatchId = bt.ID
			body.Payload = []byte(`{"disks":["nvme0n1","nvme1n1"]}`)
			id := e.InjectBatchedCommand(t, a.NodeID(), body, good, bt.ID)
			expectCancelled(t, e, a, id, "disk.wipe", daemon.ReasonLeafNotInBatch)
		})
		t.Run("proof-wrong-root", func(t *testing.T) {
			// After approval the database's leaf list changes: the proof
			// built from it no longer leads to the approved root.
			bt := approvedBatch(t, e, leavesFor("disk.wipe", nil, false, a.NodeID(), b.NodeID()))
			dbExec(t, db, `UPDATE batch_leaves SET node_id = 'n-swapped' WHERE batch_id = $1 AND idx = 1`, bt.ID)
			c, err := e.Client.CreateCommandInBatch(ctx, a.NodeID(), "disk.wipe", nil, bt.ID)
			if err != nil {
				t.Fatal(err)
			}
			expectCancelled(t, e, a, c.ID, "disk.wipe", daemon.ReasonProofWrongRoot)
		})
	})
}

func setCLIEnv(t *testing.T, e *testenv.Env) {
	t.Setenv("BC_ADDR", e.Client.BaseURL)
	t.Setenv("BC_API_KEY", e.AdminKey)
	t.Setenv("BC_API_KEY_FILE", "")
}

// TestBatchApproveChecksRootLocally: `batch approve` recomputes the root
// from the leaves it fetched and refuses, before signing, when the leaf
// list in the database was tampered with; untampered, two CLI approvals
// let the command run.
func TestBatchApproveChecksRootLocally(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 2})
		a, b := e.Nodes[0], e.Nodes[1]
		ctx := context.Background()
		setCLIEnv(t, e)
		key := func(i int) string { return filepath.Join(e.ApproverDir, fmt.Sprintf("approver-%d.key", i)) }
		approvals := func(id string) int {
			var n int
			if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM batch_approvals WHERE batch_id = $1`, id).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		run := func(args ...string) (int, string) {
			var out bytes.Buffer
			code := cli.Main(args, &out, &out)
			return code, out.String()
		}

		t.Run("tampered node", func(t *testing.T) {
			bt := mustBatch(t, e, leavesFor("disk.wipe", nil, false, a.NodeID()))
			dbExec(t, db, `UPDATE batch_leaves SET node_id = $1 WHERE batch_id = $2`, b.NodeID(), bt.ID)
			code, out := run("batch", "approve", bt.ID, "--key", key(1))
			if code != 1 || !strings.Contains(out, "refusing to sign batch "+bt.ID+": the root recomputed from its leaves") || !strings.Contains(out, "differs from the server's") {
				t.Fatalf("exit %d:\n%s", code, out)
			}
			if n := approvals(bt.ID); n != 0 {
				t.Fatalf("%d approvals recorded", n)
			}
			// The server recomputes too: a signature over the stored root is refused.
			root, _ := hex.DecodeString(bt.Root)
			_, err := e.Client.ApproveBatch(ctx, bt.ID, e.ApproverKeys[0].Public().(ed25519.PublicKey),
				ed25519.Sign(e.ApproverKeys[0], quorumwire.ApprovalMessage(bt.Deployment, bt.ID, root, bt.ExpiresMS)))
			wantCode(t, err, "INVALID_STATE")
		})
		t.Run("tampered payload", func(t *testing.T) {
			bt := mustBatch(t, e, leavesFor("disk.wipe", json.RawMessage(`{"disks":["nvme0n1"]}`), false, a.NodeID()))
			dbExec(t, db, `UPDATE batch_leaves SET payload = $1 WHERE batch_id = $2`, []byte(`{"disks":["nvme0n1","nvme1n1"]}`), bt.ID)
			code, out := run("batch", "approve", bt.ID, "--key", key(1))
			if code != 1 || !strings.Contains(out, "leaf 0's payload does not match its digest") {
				t.Fatalf("exit %d:\n%s", code, out)
			}
			if n := approvals(bt.ID); n != 0 {
				t.Fatalf("%d approvals recorded", n)
			}
		})
		t.Run("untampered", func(t *testing.T) {
			code, out := run("batch", "create", "--kind", "disk.wipe", "--node", a.NodeID(), "--json")
			if code != 0 {
				t.Fatalf("batch create exit %d:\n%s", code, out)
			}
			var bt client.Batch
			if err := json.Unmarshal([]byte(out), &bt); err != nil {
				t.Fatal(err)
			}
			for _, i := range []int{1, 3} {
				if code, out := run("batch", "approve", bt.ID, "--key", key(i), "--deployment", e.Bundle.Deployment, "--yes"); code != 0 {
					t.Fatalf("approve %d: exit %d:\n%s", i, code, out)
				}
			}
			code, out = run("commands", "run", "--node", a.NodeID(), "--kind", "disk.wipe", "--batch", bt.ID, "--wait", "--json")
			var c client.Command
			if err := json.Unmarshal([]byte(out), &c); code != 0 || err != nil || c.State != "succeeded" || !c.Attested {
				t.Fatalf("commands run exit %d:\n%s", code, out)
			}
		})
		t.Run("other deployment", func(t *testing.T) {
			bt := mustBatch(t, e, leavesFor("disk.wipe", nil, false, a.NodeID()))
			code, out := run("batch", "approve", bt.ID, "--key", key(1), "--deployment", "prod.example")
			if code != 1 || !strings.Contains(out, `it is for deployment "test.bc.local", not "prod.example"`) {
				t.Fatalf("exit %d:\n%s", code, out)
			}
		})
	})
}

// setChange writes an approver-set change straight into the database, as
// a compromised control plane could, signed by signers.
func setChange(t *testing.T, e *testenv.Env, gen uint64, threshold int, keys []ed25519.PublicKey, signers ...ed25519.PrivateKey) {
	t.Helper()
	raw := make([][]byte, len(keys))
	for i, k := range keys {
		raw[i] = k
	}
	set, err := quorumwire.NewApproverSet(gen, threshold, raw)
	if err != nil {
		t.Fatal(err)
	}
	msg := quorumwire.ApproverSetMessage(e.Bundle.Deployment, set)
	var sigs []quorumwire.Signature
	for _, s := range signers {
		sigs = append(sigs, quorumwire.Signature{PublicKey: s.Public().(ed25519.PublicKey), Signature: ed25519.Sign(s, msg)})
	}
	enc, _ := json.Marshal(sigs)
	dbExec(t, e.CP.DB, `DELETE FROM approver_sets`)
	dbExec(t, e.CP.DB, `INSERT INTO approver_sets (generation, deployment, threshold, keys, signatures, created_at) VALUES ($1, $2, $3, $4, $5, 0)`,
		int64(gen), e.Bundle.Deployment, threshold, bytes.Join(set.RawKeys(), nil), string(enc))
	e.CP.Bus.Publish(bus.TopicApprovers)
}

// TestApproverSetChangeNeedsCurrentQuorum: a node takes a new approver set
// only when its current approvers' quorum signed it; one signed by the join
// key, by k-1 approvers, or with an old generation is refused with its
// reason. An accepted set is kept (0600) across restarts and replaces the
// old one for batches.
func TestApproverSetChangeNeedsCurrentQuorum(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		n := e.Nodes[0]
		ctx := context.Background()
		old := e.ApproverKeys
		var newPub []ed25519.PublicKey
		var newKeys []ed25519.PrivateKey
		for i := 0; i < 3; i++ {
			pub, priv, _ := ed25519.GenerateKey(rand.Reader)
			newPub, newKeys = append(newPub, pub), append(newKeys, priv)
		}
		joinKey, err := e.Bundle.JoinSigningKey(e.KEK)
		if err != nil {
			t.Fatal(err)
		}
		expect := func(t *testing.T, reason string) {
			t.Helper()
			if ev := n.WaitApproverSet(t); ev.Reason != reason {
				t.Fatalf("approver-set decision %q (generation %d), want %q", ev.Reason, ev.Generation, reason)
			}
			if g := n.ApproverGeneration(); g != 0 {
				t.Fatalf("node moved to generation %d", g)
			}
		}
		t.Run("approver-set-unpinned", func(t *testing.T) {
			setChange(t, e, 1, 1, newPub, joinKey)
			expect(t, daemon.ReasonSetUnpinned)
		})
		t.Run("approver-set-under-quorum", func(t *testing.T) {
			setChange(t, e, 1, 2, newPub, old[0])
			expect(t, daemon.ReasonSetUnderQuorum)
		})
		t.Run("approver-set-replayed", func(t *testing.T) {
			setChange(t, e, 0, 2, newPub, old[0], old[1])
			expect(t, daemon.ReasonSetReplayed)
		})
		t.Run("the control plane ignores them too", func(t *testing.T) {
			cur, err := e.Client.Approvers(ctx)
			if err != nil || cur.Generation != 0 || len(cur.Keys) != 3 {
				t.Fatalf("control plane's set = %+v, %v", cur, err)
			}
			dbExec(t, db, `DELETE FROM approver_sets`)
		})
		t.Run("accepted with the current quorum", func(t *testing.T) {
			raw := make([][]byte, len(newPub))
			for i, k := range newPub {
				raw[i] = k
			}
			set, _ := quorumwire.NewApproverSet(1, 2, raw)
			msg := quorumwire.ApproverSetMessage(e.Bundle.Deployment, set)
			_, err := e.Client.SignApprovers(ctx, 1, 2, set.RawKeys(), newPub[0], ed25519.Sign(newKeys[0], msg))
			wantCode(t, err, "ACCESS_DENIED") // a new key cannot vote itself in
			st, err := e.Client.SignApprovers(ctx, 1, 2, set.RawKeys(), old[0].Public().(ed25519.PublicKey), ed25519.Sign(old[0], msg))
			if err != nil || st.Applied || st.Signed != 1 {
				t.Fatalf("first signature: %+v %v", st, err)
			}
			st, err = e.Client.SignApprovers(ctx, 1, 2, set.RawKeys(), old[2].Public().(ed25519.PublicKey), ed25519.Sign(old[2], msg))
			if err != nil || !st.Applied {
				t.Fatalf("second signature: %+v %v", st, err)
			}
			if ev := n.WaitApproverSet(t); ev.Reason != "" || ev.Generation != 1 || n.ApproverGeneration() != 1 {
				t.Fatalf("node's decision %+v, generation %d", ev, n.ApproverGeneration())
			}
			info, err := os.Stat(filepath.Join(n.Dir, "approvers.json"))
			if err != nil || info.Mode().Perm() != 0o600 {
				t.Fatalf("approvers.json: %v %v", info, err)
			}
		})
		t.Run("old approvers are unpinned now", func(t *testing.T) {
			bt := mustBatch(t, e, leavesFor("disk.wipe", nil, false, n.NodeID()))
			root, _ := hex.DecodeString(bt.Root)
			msg := quorumwire.ApprovalMessage(bt.Deployment, bt.ID, root, bt.ExpiresMS)
			_, err := e.Client.ApproveBatch(ctx, bt.ID, old[0].Public().(ed25519.PublicKey), ed25519.Sign(old[0], msg))
			wantCode(t, err, "ACCESS_DENIED")
			dbExec(t, db, `UPDATE batches SET state = 'approved' WHERE id = $1`, bt.ID)
			for _, key := range old[:2] {
				dbExec(t, db, `INSERT INTO batch_approvals (batch_id, approver_key, signature, submitted_by, created_at) VALUES ($1, $2, $3, 'test', 0)`,
					bt.ID, []byte(key.Public().(ed25519.PublicKey)), ed25519.Sign(key, msg))
			}
			c, err := e.Client.CreateCommandInBatch(ctx, n.NodeID(), "disk.wipe", nil, bt.ID)
			if err != nil {
				t.Fatal(err)
			}
			expectCancelled(t, e, n, c.ID, "disk.wipe", daemon.ReasonApproverUnpinned)
		})
		t.Run("the new set approves, across a restart", func(t *testing.T) {
			n.Stop()
			n2 := e.OpenNode(t, n.Dir, "")
			if n2.ApproverGeneration() != 1 {
				t.Fatalf("after restart the node is at generation %d", n2.ApproverGeneration())
			}
			n2.Start(t)
			n2.WaitConnected(t)
			bt := mustBatch(t, e, leavesFor("disk.wipe", nil, false, n2.NodeID()))
			e.Approve(t, bt.ID, newKeys[1], newKeys[2])
			c, err := e.Client.CreateCommandInBatch(ctx, n2.NodeID(), "disk.wipe", nil, bt.ID)
			if err != nil {
				t.Fatal(err)
			}
			if got := e.WaitCommand(t, c.ID); got.State != "succeeded" || !got.Attested {
				t.Fatalf("command under the new set: %s %q", got.State, got.Reason)
			}
		})
	})
}
