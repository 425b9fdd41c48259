package quorumwire

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"
)

// mth is RFC 6962 §2.1's Merkle Tree Hash written out directly, as an
// independent reference for Root and the proofs.
func mth(leaves [][]byte) []byte {
	if len(leaves) == 1 {
		h := sha256.Sum256(append([]byte{0}, leaves[0]...))
		return h[:]
	}
	k := 1
	for k*2 < len(leaves) {
		k *= 2
	}
	l, r := mth(leaves[:k]), mth(leaves[k:])
	h := sha256.Sum256(append(append([]byte{1}, l...), r...))
	return h[:]
}

func testLeaves(n int) []Leaf {
	out := make([]Leaf, n)
	for i := range out {
		if i%3 == 2 {
			out[i] = UnboundLeaf(fmt.Sprintf("n%d", i), "node.reboot")
		} else {
			out[i] = BoundLeaf(fmt.Sprintf("n%d", i), "disk.wipe", []byte(fmt.Sprintf(`{"i":%d}`, i)))
		}
	}
	return out
}

func TestLeafEncoding(t *testing.T) {
	b := BoundLeaf("n1", "disk.wipe", []byte("{}"))
	sum := sha256.Sum256([]byte("{}"))
	want := append([]byte("bc-batch-leaf-v1\x00\x02n1\x09disk.wipe\x00"), sum[:]...)
	if !bytes.Equal(b.Encode(), want) {
		t.Fatalf("bound leaf = %x, want %x", b.Encode(), want)
	}
	u := UnboundLeaf("n1", "disk.wipe")
	if got := u.Encode(); !bytes.Equal(got, []byte("bc-batch-leaf-v1\x00\x02n1\x09disk.wipe\x01")) {
		t.Fatalf("unbound leaf = %q", got)
	}
	for _, l := range []Leaf{b, u} {
		got, err := DecodeLeaf(l.Encode())
		if err != nil || got != l {
			t.Fatalf("round trip %+v: %+v %v", l, got, err)
		}
	}
	if !b.Admits("n1", "disk.wipe", []byte("{}")) || b.Admits("n1", "disk.wipe", []byte(`{"a":1}`)) ||
		b.Admits("n2", "disk.wipe", []byte("{}")) || b.Admits("n1", "node.reboot", []byte("{}")) {
		t.Fatal("bound leaf admits the wrong commands")
	}
	if !u.Admits("n1", "disk.wipe", []byte(`{"a":1}`)) || u.Admits("n1", "gpu.reset", nil) || u.Admits("n2", "disk.wipe", nil) {
		t.Fatal("unbound leaf admits the wrong commands")
	}
	if bytes.Equal(b.Hash(), u.Hash()) {
		t.Fatal("bound and unbound leaves hash the same")
	}
	enc := b.Encode()
	bad := map[string][]byte{
		"empty":              nil,
		"no context":         enc[len(LeafContext):],
		"truncated digest":   enc[:len(enc)-1],
		"trailing byte":      append(bytes.Clone(enc), 0),
		"unknown flag":       append(bytes.Clone(enc[:len(enc)-33]), 0x02),
		"unbound and digest": append(append(bytes.Clone(enc[:len(enc)-33]), 0x01), sum[:]...),
		"bound no digest":    append(bytes.Clone(enc[:len(enc)-33]), 0x00),
		"node length over":   append([]byte(LeafContext), 0xff, 'a'),
		"bad node id":        UnboundLeaf("N1", "disk.wipe").Encode(),
		"empty kind":         []byte("bc-batch-leaf-v1\x00\x02n1\x00\x01"),
		"bad kind":           []byte("bc-batch-leaf-v1\x00\x02n1\x03a b\x01"),
	}
	for name, data := range bad {
		if _, err := DecodeLeaf(data); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v, want ErrMalformed", name, err)
		}
	}
}

func TestRootAndProofs(t *testing.T) {
	if _, err := Root(nil); !errors.Is(err, ErrMalformed) {
		t.Fatalf("empty batch: %v", err)
	}
	for n := 1; n <= 33; n++ {
		leaves := testLeaves(n)
		enc := make([][]byte, n)
		for i, l := range leaves {
			enc[i] = l.Encode()
		}
		root, err := Root(leaves)
		if err != nil {
			t.Fatal(err)
		}
		if want := mth(enc); !bytes.Equal(root, want) {
			t.Fatalf("n=%d: root %x, want RFC 6962 %x", n, root, want)
		}
		for i := range leaves {
			p, err := Prove(leaves, i)
			if err != nil {
				t.Fatal(err)
			}
			got, err := RootFromProof(leaves[i], uint64(i), uint64(n), p)
			if err != nil || !bytes.Equal(got, root) {
				t.Fatalf("n=%d i=%d: proof leads to %x (%v), want %x", n, i, got, err, root)
			}
			other := UnboundLeaf("zz", "disk.wipe")
			if got, _ := RootFromProof(other, uint64(i), uint64(n), p); bytes.Equal(got, root) {
				t.Fatalf("n=%d i=%d: another leaf proves into the root", n, i)
			}
			// The proof holds only at its own index, for its own leaf:
			// not at another index, nor for another leaf of the batch.
			for j := range leaves {
				if j == i {
					continue
				}
				if got, _ := RootFromProof(leaves[i], uint64(j), uint64(n), p); bytes.Equal(got, root) {
					t.Fatalf("n=%d: the proof of index %d verifies at index %d", n, i, j)
				}
				if got, _ := RootFromProof(leaves[j], uint64(i), uint64(n), p); bytes.Equal(got, root) {
					t.Fatalf("n=%d: the proof of leaf %d verifies leaf %d", n, i, j)
				}
			}
			if len(p) > 0 {
				p[0] = bytes.Clone(p[0])
				p[0][0] ^= 1
				if got, _ := RootFromProof(leaves[i], uint64(i), uint64(n), p); bytes.Equal(got, root) {
					t.Fatalf("n=%d i=%d: a tampered proof still leads to the root", n, i)
				}
			}
		}
	}
	leaves := testLeaves(5)
	p, _ := Prove(leaves, 1)
	for name, f := range map[string]func() ([]byte, error){
		"index beyond size": func() ([]byte, error) { return RootFromProof(leaves[1], 5, 5, p) },
		"size zero":         func() ([]byte, error) { return RootFromProof(leaves[1], 0, 0, p) },
		"short hash":        func() ([]byte, error) { return RootFromProof(leaves[1], 1, 5, [][]byte{p[0][:31], p[1], p[2]}) },
		"wrong length":      func() ([]byte, error) { return RootFromProof(leaves[1], 1, 5, p[:2]) },
	} {
		if _, err := f(); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

type approver struct {
	pub  ed25519.PublicKey
	priv ed25519.PrivateKey
}

func newApprovers(t testing.TB, n int) []approver {
	out := make([]approver, n)
	for i := range out {
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = approver{pub, priv}
	}
	return out
}

func setOf(t testing.TB, gen uint64, k int, as ...approver) ApproverSet {
	var keys [][]byte
	for _, a := range as {
		keys = append(keys, a.pub)
	}
	s, err := NewApproverSet(gen, k, keys)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func sign(msg []byte, as ...approver) []Signature {
	var out []Signature
	for _, a := range as {
		out = append(out, Signature{PublicKey: a.pub, Signature: ed25519.Sign(a.priv, msg)})
	}
	return out
}

func TestApprovalMessage(t *testing.T) {
	root := bytes.Repeat([]byte{0xab}, 32)
	got := ApprovalMessage("dep", "b1", root, 0x0102030405060708)
	want := "62632d62617463682d617070726f76616c2d763100" + "0003646570" + "00026231" + "0020" + hex.EncodeToString(root) + "0102030405060708"
	if hex.EncodeToString(got) != want {
		t.Fatalf("approval message %x, want %s", got, want)
	}
}

func TestCheckQuorum(t *testing.T) {
	a := newApprovers(t, 4)
	set := setOf(t, 0, 2, a[0], a[1], a[2])
	msg := ApprovalMessage("dep", "b1", bytes.Repeat([]byte{1}, 32), 1)
	forged := sign(msg, a[0])[0]
	forged.Signature = bytes.Clone(forged.Signature)
	forged.Signature[0] ^= 1
	cases := []struct {
		name string
		set  ApproverSet
		sigs []Signature
		want error
	}{
		{"two of three", set, sign(msg, a[0], a[2]), nil},
		{"three of three", set, sign(msg, a[0], a[1], a[2]), nil},
		{"one", set, sign(msg, a[1]), ErrUnderQuorum},
		{"none", set, nil, ErrUnderQuorum},
		{"same approver twice", set, sign(msg, a[1], a[1]), ErrUnderQuorum},
		{"one forged", set, append(sign(msg, a[1]), forged), ErrUnderQuorum},
		{"another message", set, append(sign(msg, a[1]), sign([]byte("x"), a[2])...), ErrUnderQuorum},
		{"unpinned among enough", set, sign(msg, a[0], a[1], a[3]), ErrUnpinned},
		{"only unpinned", set, sign(msg, a[3]), ErrUnpinned},
		{"nothing pinned", ApproverSet{}, nil, ErrUnderQuorum},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := CheckQuorum(c.set, msg, c.sigs); !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
		})
	}
}

func TestNextApproverSet(t *testing.T) {
	a := newApprovers(t, 5)
	cur := setOf(t, 0, 2, a[0], a[1], a[2])
	next := setOf(t, 1, 2, a[2], a[3], a[4])
	msg := ApproverSetMessage("dep", next)
	join := newApprovers(t, 1)[0] // the join key is not an approver
	ok, err := NextApproverSet(cur, "dep", "dep", 1, 2, next.RawKeys(), sign(msg, a[0], a[1]))
	if err != nil || ok.Generation != 1 || !ok.Contains(a[4].pub) || ok.Contains(a[0].pub) {
		t.Fatalf("accepted %+v %v", ok, err)
	}
	unsorted := next.RawKeys()
	unsorted[0], unsorted[1] = unsorted[1], unsorted[0]
	cases := []struct {
		name string
		dep  string
		gen  uint64
		k    int
		keys [][]byte
		sigs []Signature
		want error
	}{
		{"join key only", "dep", 1, 2, next.RawKeys(), sign(msg, join), ErrUnpinned},
		{"k-1 approvers", "dep", 1, 2, next.RawKeys(), sign(msg, a[0]), ErrUnderQuorum},
		{"new keys vote themselves in", "dep", 1, 2, next.RawKeys(), sign(msg, a[3], a[4]), ErrUnpinned},
		{"one kept and one new key", "dep", 1, 2, next.RawKeys(), sign(msg, a[2], a[3]), ErrUnpinned},
		{"replayed generation", "dep", 0, 2, next.RawKeys(), sign(ApproverSetMessage("dep", ApproverSet{Generation: 0, Threshold: 2, Keys: next.Keys}), a[0], a[1]), ErrReplayed},
		{"signed for another generation", "dep", 2, 2, next.RawKeys(), sign(msg, a[0], a[1]), ErrUnderQuorum},
		{"signed for another threshold", "dep", 1, 1, next.RawKeys(), sign(msg, a[0], a[1]), ErrUnderQuorum},
		{"other deployment", "other", 1, 2, next.RawKeys(), sign(msg, a[0], a[1]), ErrWrongDeployment},
		{"unsorted keys", "dep", 1, 2, unsorted, sign(msg, a[0], a[1]), ErrMalformed},
		{"threshold above count", "dep", 1, 4, next.RawKeys(), sign(msg, a[0], a[1]), ErrMalformed},
		{"empty set", "dep", 1, 0, nil, sign(msg, a[0], a[1]), ErrMalformed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := NextApproverSet(cur, "dep", c.dep, c.gen, c.k, c.keys, c.sigs); !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
		})
	}
	if _, err := NextApproverSet(ok, "dep", "dep", 1, 2, next.RawKeys(), sign(msg, a[2], a[3])); !errors.Is(err, ErrReplayed) {
		t.Fatalf("the same change again: %v", err)
	}
}

// FuzzDecodeLeaf: the leaf parser never panics, and whatever it accepts
// re-encodes to exactly the input bytes (one leaf, one encoding).
func FuzzDecodeLeaf(f *testing.F) {
	f.Add(BoundLeaf("n1", "disk.wipe", []byte("{}")).Encode())
	f.Add(UnboundLeaf("n1", "node.reboot").Encode())
	f.Add([]byte(LeafContext))
	f.Fuzz(func(t *testing.T, data []byte) {
		l, err := DecodeLeaf(data)
		if err != nil {
			return
		}
		if !bytes.Equal(l.Encode(), data) {
			t.Fatalf("accepted a non-canonical leaf %x", data)
		}
	})
}

// FuzzRootFromProof: arbitrary proofs never panic and never lead a leaf
// that is not in the batch to the batch's root.
func FuzzRootFromProof(f *testing.F) {
	leaves := testLeaves(7)
	root, _ := Root(leaves)
	p, _ := Prove(leaves, 3)
	f.Add(leaves[3].Encode(), uint64(3), uint64(7), bytes.Join(p, nil))
	f.Add(UnboundLeaf("n9", "disk.wipe").Encode(), uint64(3), uint64(7), bytes.Join(p, nil))
	f.Add([]byte{}, uint64(0), uint64(1), []byte{})
	in := map[string]bool{}
	for _, l := range leaves {
		in[string(l.Encode())] = true
	}
	f.Fuzz(func(t *testing.T, leaf []byte, index, size uint64, flat []byte) {
		l, err := DecodeLeaf(leaf)
		if err != nil {
			return
		}
		var hashes [][]byte
		for len(flat) >= 32 {
			hashes, flat = append(hashes, flat[:32]), flat[32:]
		}
		got, err := RootFromProof(l, index, size, hashes)
		if err == nil && bytes.Equal(got, root) && !in[string(l.Encode())] {
			t.Fatalf("a leaf outside the batch proved into its root")
		}
	})
}

// FuzzCheckQuorum: arbitrary signature lists never reach a quorum without
// two real signatures by pinned approvers.
func FuzzCheckQuorum(f *testing.F) {
	a := newApprovers(f, 3)
	set := setOf(f, 0, 2, a[0], a[1], a[2])
	msg := ApprovalMessage("dep", "b1", bytes.Repeat([]byte{7}, 32), 99)
	good := sign(msg, a[0])[0]
	f.Add(good.PublicKey, good.Signature, []byte(a[1].pub), []byte{1})
	f.Fuzz(func(t *testing.T, k1, s1, k2, s2 []byte) {
		sigs := []Signature{{k1, s1}, {k2, s2}, good}
		err := CheckQuorum(set, msg, sigs)
		if err == nil && !(set.Contains(k1) && ed25519.Verify(k1, msg, s1) && !bytes.Equal(k1, good.PublicKey) ||
			set.Contains(k2) && ed25519.Verify(k2, msg, s2) && !bytes.Equal(k2, good.PublicKey)) {
			t.Fatal("quorum reached without a second real approval")
		}
	})
}
