package daemon

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/quorum/quorumwire"
)

type batchFixture struct {
	fixture
	keys   []ed25519.PrivateKey
	leaves []quorumwire.Leaf
	root   []byte
}

func newBatchFixture(t testing.TB) batchFixture {
	t.Helper()
	f := batchFixture{fixture: newFixture(t)}
	var pubs [][]byte
	for i := 0; i < 3; i++ {
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		f.keys, pubs = append(f.keys, priv), append(pubs, pub)
	}
	set, err := quorumwire.NewApproverSet(0, 2, pubs)
	if err != nil {
		t.Fatal(err)
	}
	f.v.Deployment = "dep"
	f.v.Approvers = func() quorumwire.ApproverSet { return set }
	f.leaves = []quorumwire.Leaf{
		quorumwire.BoundLeaf("n2", "disk.wipe", []byte("{}")),
		quorumwire.BoundLeaf("n1", "disk.wipe", []byte("{}")),
		quorumwire.UnboundLeaf("n1", "node.reboot"),
	}
	if f.root, err = quorumwire.Root(f.leaves); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f batchFixture) approval(batchID string, root []byte, expires time.Time, keys ...ed25519.PrivateKey) *nodev1.BatchApproval {
	ap := &nodev1.BatchApproval{Deployment: "dep", BatchId: batchID, Root: root, ExpiresAtMs: expires.UnixMilli()}
	msg := quorumwire.ApprovalMessage(ap.Deployment, ap.BatchId, ap.Root, ap.ExpiresAtMs)
	for _, k := range keys {
		ap.Signatures = append(ap.Signatures, &nodev1.ApproverSignature{PublicKey: k.Public().(ed25519.PublicKey), Signature: ed25519.Sign(k, msg)})
	}
	return ap
}

func (f batchFixture) proof(t testing.TB, leaves []quorumwire.Leaf, i int) *nodev1.InclusionProof {
	t.Helper()
	h, err := quorumwire.Prove(leaves, i)
	if err != nil {
		t.Fatal(err)
	}
	return &nodev1.InclusionProof{Leaf: leaves[i].Encode(), LeafIndex: uint64(i), TreeSize: uint64(len(leaves)), Hashes: h}
}

// command is a destructive command for n1 in batch b1, signed by the
// worker, with the approval and proof given.
func (f batchFixture) command(kind string, payload []byte, batchID string, ap *nodev1.BatchApproval, pr *nodev1.InclusionProof) *nodev1.SignedCommand {
	c := f.sign(f.body(func(b *nodev1.CommandBody) { b.Kind, b.Payload, b.BatchId = kind, payload, batchID }))
	c.Approval, c.Proof = ap, pr
	return c
}

func TestVerifierBatchRefusals(t *testing.T) {
	f := newBatchFixture(t)
	k := f.keys
	soon := f.now.Add(time.Hour)
	good := f.approval("b1", f.root, soon, k[0], k[2])
	_, rogue, _ := ed25519.GenerateKey(rand.Reader)
	otherLeaves := []quorumwire.Leaf{quorumwire.UnboundLeaf("n9", "disk.wipe"), f.leaves[1]}
	otherRoot, _ := quorumwire.Root(otherLeaves)
	cases := []struct {
		name   string
		cmd    *nodev1.SignedCommand
		reason string
	}{
		{"bound leaf", f.command("disk.wipe", []byte("{}"), "b1", good, f.proof(t, f.leaves, 1)), ""},
		{"unbound leaf, any payload", f.command("node.reboot", []byte(`{"why":"x"}`), "b1", good, f.proof(t, f.leaves, 2)), ""},
		{"no batch", f.command("disk.wipe", []byte("{}"), "", good, f.proof(t, f.leaves, 1)), ReasonUnbatchedDestructive},
		{"no approval", f.command("disk.wipe", []byte("{}"), "b1", nil, f.proof(t, f.leaves, 1)), ReasonBatchUnderQuorum},
		{"approval of another batch", f.command("disk.wipe", []byte("{}"), "b2", good, f.proof(t, f.leaves, 1)), ReasonBatchMismatch},
		{"approval for another deployment", f.command("disk.wipe", []byte("{}"), "b1", func() *nodev1.BatchApproval {
			ap := f.approval("b1", f.root, soon, k[0], k[1])
			ap.Deployment = "other"
			return ap
		}(), f.proof(t, f.leaves, 1)), ReasonBatchMismatch},
		{"k-1 approvals", f.command("disk.wipe", []byte("{}"), "b1", f.approval("b1", f.root, soon, k[1]), f.proof(t, f.leaves, 1)), ReasonBatchUnderQuorum},
		{"one approver twice", f.command("disk.wipe", []byte("{}"), "b1", f.approval("b1", f.root, soon, k[1], k[1]), f.proof(t, f.leaves, 1)), ReasonBatchUnderQuorum},
		{"unpinned signer", f.command("disk.wipe", []byte("{}"), "b1", f.approval("b1", f.root, soon, k[0], k[1], rogue), f.proof(t, f.leaves, 1)), ReasonApproverUnpinned},
		{"expiry altered after signing", f.command("disk.wipe", []byte("{}"), "b1", func() *nodev1.BatchApproval {
			ap := f.approval("b1", f.root, soon, k[0], k[1])
			ap.ExpiresAtMs += 1000
			return ap
		}(), f.proof(t, f.leaves, 1)), ReasonBatchUnderQuorum},
		{"expired", f.command("disk.wipe", []byte("{}"), "b1", f.approval("b1", f.root, f.now.Add(-time.Second), k[0], k[1]), f.proof(t, f.leaves, 1)), ReasonBatchExpired},
		{"no proof", f.command("disk.wipe", []byte("{}"), "b1", good, nil), ReasonLeafNotInBatch},
		{"proof of another node's leaf", f.command("disk.wipe", []byte("{}"), "b1", good, f.proof(t, f.leaves, 0)), ReasonLeafNotInBatch},
		{"payload not the leaf's", f.command("disk.wipe", []byte(`{"disks":["nvme0n1"]}`), "b1", good, f.proof(t, f.leaves, 1)), ReasonLeafNotInBatch},
		{"unbound leaf of another kind", f.command("disk.wipe", []byte("{}"), "b1", good, f.proof(t, f.leaves, 2)), ReasonLeafNotInBatch},
		{"garbage leaf", f.command("disk.wipe", []byte("{}"), "b1", good, &nodev1.InclusionProof{Leaf: []byte("x"), TreeSize: 1}), ReasonLeafNotInBatch},
		{"proof for another root", f.command("disk.wipe", []byte("{}"), "b1", good, f.proof(t, otherLeaves, 1)), ReasonProofWrongRoot},
		{"proof index moved", f.command("disk.wipe", []byte("{}"), "b1", good, func() *nodev1.InclusionProof {
			p := f.proof(t, f.leaves, 1)
			p.LeafIndex = 0
			return p
		}()), ReasonProofWrongRoot},
		{"approval of another root", f.command("disk.wipe", []byte("{}"), "b1", f.approval("b1", otherRoot, soon, k[0], k[1]), f.proof(t, f.leaves, 1)), ReasonProofWrongRoot},
		{"non-destructive kinds need no batch", f.command("diag.run", []byte("{}"), "", nil, nil), ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, reason := f.v.Check(c.cmd, f.now, nil, never); reason != c.reason {
				t.Fatalf("reason %q, want %q", reason, c.reason)
			}
		})
	}
	none := *f.v
	none.Approvers = nil
	// A node that pinned no approvers takes no signature as an approver's.
	if _, reason := none.Check(cases[0].cmd, f.now, nil, never); reason != ReasonApproverUnpinned {
		t.Fatalf("without pinned approvers: %q", reason)
	}
	if _, reason := none.Check(f.command("disk.wipe", []byte("{}"), "b1", f.approval("b1", f.root, soon), f.proof(t, f.leaves, 1)), f.now, nil, never); reason != ReasonBatchUnderQuorum {
		t.Fatalf("without pinned approvers or signatures: %q", reason)
	}
}

// FuzzVerifierCheckBatch mutates the approval and the proof around a
// validly signed destructive command: the node must never accept a root
// the approvers did not sign, nor a leaf that is not in that batch.
func FuzzVerifierCheckBatch(f *testing.F) {
	fx := newBatchFixture(f)
	good := fx.approval("b1", fx.root, fx.now.Add(time.Hour), fx.keys[0], fx.keys[1])
	p := fx.proof(f, fx.leaves, 1)
	f.Add(fx.root, good.ExpiresAtMs, p.Leaf, p.LeafIndex, p.TreeSize, bytes.Join(p.Hashes, nil))
	f.Add(fx.root, good.ExpiresAtMs, fx.leaves[0].Encode(), uint64(0), uint64(3), bytes.Join(p.Hashes, nil))
	f.Add([]byte{}, int64(0), []byte{}, uint64(0), uint64(0), []byte{})
	in := map[string]bool{}
	for _, l := range fx.leaves {
		in[string(l.Encode())] = true
	}
	f.Fuzz(func(t *testing.T, root []byte, expires int64, leaf []byte, index, size uint64, flat []byte) {
		ap := fx.approval("b1", root, time.UnixMilli(expires), fx.keys[0], fx.keys[1])
		pr := &nodev1.InclusionProof{Leaf: leaf, LeafIndex: index, TreeSize: size}
		for len(flat) >= 32 {
			pr.Hashes, flat = append(pr.Hashes, flat[:32]), flat[32:]
		}
		// The approvers signed exactly (fx.root, good expiry); anything
		// else carries their signatures over other bytes only if equal.
		if !bytes.Equal(root, fx.root) || expires != good.ExpiresAtMs {
			ap.Signatures = good.Signatures
		}
		_, reason := fx.v.Check(fx.command("disk.wipe", []byte("{}"), "b1", ap, pr), fx.now, nil, never)
		if reason == "" && (!bytes.Equal(root, fx.root) || !in[string(leaf)]) {
			t.Fatalf("accepted root %x with leaf %x", root, leaf)
		}
	})
}
