package auditlog

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
	"testing"

	"github.com/transparency-dev/merkle/compact"
	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"
	"golang.org/x/mod/sumdb/note"
)

// The pure steps of sealing and verifying, tested without a database.

const stepDeployment = "steps.bc.local"

func stepKey(t testing.TB, b byte) (note.Signer, note.Verifier) {
	t.Helper()
	priv := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{b}, ed25519.SeedSize))
	k, err := NewSigningKey(stepDeployment, priv)
	if err != nil {
		t.Fatal(err)
	}
	return k.Signer, k.Verifier
}

// memTree grows a log in memory with appendRows, as sealBatch does, and
// keeps every node and the root at every size it was grown to.
type memTree struct {
	rf    *compact.RangeFactory
	rng   *compact.Range
	nodes map[compact.NodeID][]byte
	roots map[uint64][]byte
}

func newMemTree() *memTree {
	rf := &compact.RangeFactory{Hash: rfc6962.DefaultHasher.HashChildren}
	return &memTree{rf: rf, rng: rf.NewEmptyRange(0), nodes: map[compact.NodeID][]byte{}, roots: map[uint64][]byte{}}
}

func (m *memTree) grow(t testing.TB, n int) uint64 {
	t.Helper()
	size := int64(m.rng.End())
	batch := make([]Row, n)
	for i := range batch {
		batch[i] = Row{ID: fmt.Sprintf("ev_%d", size+int64(i)), TenantID: "t", At: 1000 + size + int64(i), Details: "{}"}
	}
	nodes, err := appendRows(m.rng, size, batch)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range batch {
		if r.Seq != size+int64(i) {
			t.Fatalf("row %d numbered %d", i, r.Seq)
		}
	}
	leaves := 0
	for _, nd := range nodes {
		m.nodes[compact.NewNodeID(nd.level, nd.idx)] = nd.hash
		if nd.level == 0 {
			if nd.event != fmt.Sprintf("ev_%d", nd.idx) {
				t.Fatalf("leaf %d names event %s", nd.idx, nd.event)
			}
			leaves++
		}
	}
	if leaves != n {
		t.Fatalf("%d leaves for %d rows", leaves, n)
	}
	root, err := m.rng.GetRootHash(nil)
	if err != nil {
		t.Fatal(err)
	}
	m.roots[m.rng.End()] = root
	return m.rng.End()
}

func (m *memTree) consistency(t testing.TB, from, to uint64) []byte {
	t.Helper()
	if from == 0 {
		return nil
	}
	pn, err := proof.Consistency(from, to)
	if err != nil {
		t.Fatal(err)
	}
	hs := make([][]byte, len(pn.IDs))
	for i, id := range pn.IDs {
		hs[i] = m.nodes[id]
	}
	cons, err := pn.Rehash(hs, rfc6962.DefaultHasher.HashChildren)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Join(cons, nil)
}

func (m *memTree) checkpoint(t testing.TB, s note.Signer, origin string, prev, size uint64) storedCheckpoint {
	t.Helper()
	msg, err := SignCheckpoint(Checkpoint{Origin: origin, Size: size, Root: m.roots[size]}, s)
	if err != nil {
		t.Fatal(err)
	}
	return storedCheckpoint{size: int64(size), prev: int64(prev), note: msg, cons: m.consistency(t, prev, size)}
}

func TestAppendRowsMatchesLeafHashes(t *testing.T) {
	m := newMemTree()
	m.grow(t, 5)
	m.grow(t, 3)
	for i := range 8 {
		r := Row{Seq: int64(i), ID: fmt.Sprintf("ev_%d", i), TenantID: "t", At: 1000 + int64(i), Details: "{}"}
		if !bytes.Equal(m.nodes[compact.NewNodeID(0, uint64(i))], LeafHash(r)) {
			t.Fatalf("leaf %d is not the row's leaf hash", i)
		}
	}
}

func TestCheckCheckpoints(t *testing.T) {
	signer, v := stepKey(t, 1)
	other, _ := stepKey(t, 2)
	origin := Origin(stepDeployment, "t")
	m := newMemTree()
	s3, s7, s8 := m.grow(t, 3), m.grow(t, 4), m.grow(t, 1)
	cp3, cp7, cp8 := m.checkpoint(t, signer, origin, 0, s3), m.checkpoint(t, signer, origin, s3, s7), m.checkpoint(t, signer, origin, s7, s8)
	edit := func(c storedCheckpoint, f func(*storedCheckpoint)) storedCheckpoint {
		c.note, c.cons = bytes.Clone(c.note), bytes.Clone(c.cons)
		f(&c)
		return c
	}
	for _, tc := range []struct {
		name     string
		cps      []storedCheckpoint
		good     []int64
		last     int64
		findings []string
	}{
		{"none", nil, nil, 0, nil},
		{"a good chain", []storedCheckpoint{cp3, cp7, cp8}, []int64{3, 7, 8}, 8, nil},
		{"a checkpoint deleted", []storedCheckpoint{cp3, cp8}, []int64{3, 8}, 8, []string{"checkpoint-missing size=7"}},
		{"the first checkpoint deleted", []storedCheckpoint{cp7, cp8}, []int64{7, 8}, 8, []string{"checkpoint-missing size=3"}},
		{"a predecessor edited", []storedCheckpoint{cp3, edit(cp7, func(c *storedCheckpoint) { c.prev = 2 }), cp8}, []int64{3, 7, 8}, 8,
			[]string{"checkpoint-edited size=7"}},
		{"signed by another key", []storedCheckpoint{cp3, m.checkpoint(t, other, origin, s3, s7), cp8}, []int64{3, 8}, 8,
			[]string{"checkpoint-bad-signature size=7"}},
		{"another tenant's origin", []storedCheckpoint{cp3, m.checkpoint(t, signer, Origin(stepDeployment, "u"), s3, s7)}, []int64{3}, 7,
			[]string{"checkpoint-edited size=7"}},
		{"stored under another size", []storedCheckpoint{cp3, edit(cp7, func(c *storedCheckpoint) { c.size = 6 })}, []int64{3}, 6,
			[]string{"checkpoint-edited size=6"}},
		{"a malformed consistency proof", []storedCheckpoint{cp3, edit(cp7, func(c *storedCheckpoint) { c.cons = c.cons[1:] })}, []int64{3, 7}, 7,
			[]string{"checkpoint-inconsistent size=7"}},
		{"a wrong consistency proof", []storedCheckpoint{cp3, edit(cp7, func(c *storedCheckpoint) { c.cons[0] ^= 1 })}, []int64{3, 7}, 7,
			[]string{"checkpoint-inconsistent size=7"}},
		{"a note edited", []storedCheckpoint{cp3, edit(cp7, func(c *storedCheckpoint) { c.note[len(origin)+2] ^= 1 })}, []int64{3}, 7,
			nil}, // the kind depends on what the flip breaks; counted below
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := checkCheckpoints(tc.cps, v, origin)
			var sizes []int64
			for _, g := range got.good {
				sizes = append(sizes, int64(g.size))
				if !bytes.Equal(g.root, m.roots[g.size]) {
					t.Errorf("trusted root of size %d is not the tree's", g.size)
				}
			}
			if fmt.Sprint(sizes) != fmt.Sprint(tc.good) || got.last != tc.last {
				t.Fatalf("good %v last %d, want %v last %d", sizes, got.last, tc.good, tc.last)
			}
			if tc.name == "a note edited" {
				if len(got.findings) != 1 {
					t.Fatalf("findings %v, want one", got.findings)
				}
				return
			}
			var kinds []string
			for _, f := range got.findings {
				kinds = append(kinds, fmt.Sprintf("%s size=%d", f.Kind, *f.Size))
			}
			if fmt.Sprint(kinds) != fmt.Sprint(tc.findings) {
				t.Fatalf("findings %v, want %v", kinds, tc.findings)
			}
		})
	}
}

func TestCheckStateSize(t *testing.T) {
	for _, tc := range []struct {
		state, last, size int64
		finding           string
	}{
		{0, 0, 0, ""},
		{8, 8, 8, ""},
		{9, 8, 9, "checkpoint-missing size=9"},
		{5, 8, 8, "log-state-edited size=5"},
	} {
		size, fs := checkStateSize(tc.state, tc.last)
		got := ""
		if len(fs) == 1 {
			got = fmt.Sprintf("%s size=%d", fs[0].Kind, *fs[0].Size)
		}
		if size != tc.size || got != tc.finding || len(fs) > 1 {
			t.Errorf("checkStateSize(%d, %d) = %d, %v; want %d, %q", tc.state, tc.last, size, fs, tc.size, tc.finding)
		}
	}
}

func rowsAt(seqs ...int64) []Row {
	out := make([]Row, len(seqs))
	for i, s := range seqs {
		out[i] = Row{Seq: s, ID: fmt.Sprint("ev_", i)}
	}
	return out
}

func TestCutPage(t *testing.T) {
	for _, tc := range []struct {
		name     string
		page     []Row
		size     int
		keep     int
		next     int64
		full     bool
		tampered bool
	}{
		{"a short page is the last", rowsAt(0, 1, 2), 4, 3, 0, false, false},
		{"an empty page is the last", nil, 4, 0, 0, false, false},
		{"a full page stops before its last seq", rowsAt(0, 1, 2, 3), 4, 3, 3, true, false},
		{"rows sharing the last seq go to the next page", rowsAt(0, 1, 3, 3), 4, 2, 3, true, false},
		{"a page of one seq is tampering", rowsAt(5, 5, 5, 5), 4, 0, 0, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, next, full, err := cutPage(tc.page, tc.size)
			if tc.tampered {
				if !errors.Is(err, ErrTampered) {
					t.Fatalf("err %v, want ErrTampered", err)
				}
				return
			}
			if err != nil || len(out) != tc.keep || next != tc.next || full != tc.full {
				t.Fatalf("cutPage = %d rows, next %d, full %v, %v; want %d, %d, %v", len(out), next, full, err, tc.keep, tc.next, tc.full)
			}
		})
	}
}

// FuzzCutPage checks that paging by cutPage reads every row of a sorted
// seq list exactly once, whatever the duplicates, or reports tampering
// exactly when a page's worth of rows (or more) share one seq, which no
// keyset page can step past.
func FuzzCutPage(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7}, uint8(3))
	f.Add([]byte{0, 1, 1, 1, 2, 2, 9}, uint8(2))
	f.Add([]byte{4, 4, 4, 4}, uint8(3))
	f.Add([]byte{}, uint8(1))
	f.Fuzz(func(t *testing.T, raw []byte, size uint8) {
		if size == 0 || len(raw) > 512 {
			return
		}
		seqs := make([]int64, 0, len(raw))
		var cur int64
		for _, b := range raw { // sorted seqs: each byte adds 0 (a duplicate) to 3
			cur += int64(b % 4)
			seqs = append(seqs, cur)
		}
		maxRun, run := 0, 0
		for i := range seqs {
			if i > 0 && seqs[i] == seqs[i-1] {
				run++
			} else {
				run = 1
			}
			maxRun = max(maxRun, run)
		}
		var read []int64
		from := int64(-1)
		for pages := 0; ; pages++ {
			if pages > len(seqs)+1 {
				t.Fatal("paging does not end")
			}
			var page []Row
			for _, s := range seqs {
				if s >= from && len(page) < int(size) {
					page = append(page, Row{Seq: s})
				}
			}
			out, next, full, err := cutPage(page, int(size))
			if err != nil {
				if !errors.Is(err, ErrTampered) || maxRun < int(size) {
					t.Fatalf("err %v with at most %d rows per seq and pages of %d", err, maxRun, size)
				}
				return
			}
			for _, r := range out {
				read = append(read, r.Seq)
			}
			if !full {
				break
			}
			from = next
		}
		if maxRun >= int(size) {
			t.Fatalf("%d rows share a seq with pages of %d, and no tampering was reported", maxRun, size)
		}
		if fmt.Sprint(read) != fmt.Sprint(seqs) {
			t.Fatalf("read %v, want %v", read, seqs)
		}
	})
}

// FuzzCheckCheckpoints feeds arbitrary stored checkpoints (signed bodies
// of arbitrary sizes, arbitrary proofs and predecessors) to the chain
// check: it never trusts a checkpoint that does not verify for its stored
// size, and every stored checkpoint it does not trust has a finding.
func FuzzCheckCheckpoints(f *testing.F) {
	f.Add(int64(3), int64(0), []byte{}, int64(7), int64(3), []byte{}, false)
	f.Add(int64(3), int64(0), []byte{}, int64(7), int64(5), bytes.Repeat([]byte{1}, 64), true)
	f.Add(int64(1), int64(0), []byte("x"), int64(1), int64(1), []byte{}, false)
	f.Fuzz(func(t *testing.T, s1, p1 int64, c1 []byte, s2, p2 int64, c2 []byte, corrupt bool) {
		signer, v := stepKey(t, 1)
		origin := Origin(stepDeployment, "t")
		mk := func(size, prev int64, cons []byte, signedSize uint64) storedCheckpoint {
			msg, err := SignCheckpoint(Checkpoint{Origin: origin, Size: signedSize, Root: bytes.Repeat([]byte{byte(size)}, HashSize)}, signer)
			if err != nil {
				t.Fatal(err)
			}
			if corrupt && len(msg) > 0 {
				msg[len(msg)/2] ^= 0x20
			}
			return storedCheckpoint{size: size, prev: prev, note: msg, cons: cons}
		}
		cps := []storedCheckpoint{mk(s1, p1, c1, uint64(s1)), mk(s2, p2, c2, uint64(s2)+uint64(len(c2)%2))}
		got := checkCheckpoints(cps, v, origin)
		if got.last != s2 {
			t.Fatalf("last %d, want %d", got.last, s2)
		}
		trusted := 0
		for _, c := range cps {
			cp, err := OpenCheckpoint(c.note, v, origin)
			if err == nil && cp.Size == uint64(c.size) {
				trusted++
			}
		}
		if len(got.good) != trusted {
			t.Fatalf("%d trusted, want %d", len(got.good), trusted)
		}
		if len(got.findings) < len(cps)-trusted {
			t.Fatalf("%d findings for %d untrusted checkpoints", len(got.findings), len(cps)-trusted)
		}
	})
}
