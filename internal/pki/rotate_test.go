package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
)

// activeID identifies the active key of kind k (a CA's raw certificate or
// a bare key's bytes), to compare across steps.
func activeID(b *Bundle, k Kind) []byte {
	s := b.activeSlot(k)
	if s.cert != nil {
		return s.cert.Raw
	}
	return s.pub
}

// trustedIDs lists what the trust bundle and the verifiers trust for k.
func trustedIDs(t *testing.T, b *Bundle, k Kind) [][]byte {
	t.Helper()
	tb := b.TrustBundle(t0)
	switch k {
	case KindNodeCA:
		return tb.NodeRoots
	case KindInternalCA:
		return tb.ServerRoots
	case KindCommandRoot:
		return tb.CommandRoots
	case KindJoinKey:
		if tb.JoinKeys == nil {
			return [][]byte{b.JoinKey}
		}
		return tb.JoinKeys
	}
	var out [][]byte
	for _, a := range b.AuditKeys() {
		out = append(out, a)
	}
	return out
}

// unsealActive unseals the active key of k and returns its public half.
func unsealActive(t *testing.T, b *Bundle, kek KEK, k Kind) []byte {
	t.Helper()
	var pub any
	var err error
	switch k {
	case KindNodeCA:
		var key *ecdsa.PrivateKey
		if key, err = b.NodeCAKey(kek); err == nil {
			pub = key.Public()
		}
	case KindInternalCA:
		var key *ecdsa.PrivateKey
		if key, err = b.InternalCAKey(kek); err == nil {
			pub = key.Public()
		}
	case KindCommandRoot:
		var key ed25519.PrivateKey
		key, err = b.CommandRootKey(kek)
		pub = key.Public()
	case KindJoinKey:
		var key ed25519.PrivateKey
		key, err = b.JoinSigningKey(kek)
		pub = key.Public()
	case KindAuditKey:
		var key ed25519.PrivateKey
		key, err = b.AuditSigningKey(kek)
		pub = key.Public()
	}
	if err != nil {
		t.Fatalf("%s: unseal active: %v", k, err)
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func pubDER(t *testing.T, b *Bundle, k Kind) []byte {
	t.Helper()
	s := b.activeSlot(k)
	var pub any = s.pub
	if s.cert != nil {
		pub = s.cert.PublicKey
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func contains(list [][]byte, x []byte) bool {
	for _, y := range list {
		if bytes.Equal(x, y) {
			return true
		}
	}
	return false
}

// TestRotateEveryKey walks each key through stage, activate and retire and
// checks at each step what signs and what is trusted: a staged key is
// trusted and signs nothing, an activated one signs and its predecessor
// stays trusted, a retired predecessor is trusted no more (a retired audit
// key stays a verifier), and every step survives a reload.
func TestRotateEveryKey(t *testing.T) {
	for _, k := range Kinds {
		t.Run(string(k), func(t *testing.T) {
			_, kek, dir := newBundle(t)
			clk := clock.NewFake(t0.Add(time.Hour))
			orig, err := Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			old := activeID(orig, k)

			if _, err := RotateStage(dir, kek, k, clk); err != nil {
				t.Fatal(err)
			}
			b, err := Load(dir)
			if err != nil {
				t.Fatalf("reload after stage: %v", err)
			}
			if !bytes.Equal(activeID(b, k), old) {
				t.Fatal("stage changed the active key")
			}
			trusted := trustedIDs(t, b, k)
			if len(trusted) != 2 || !contains(trusted, old) {
				t.Fatalf("after stage %d keys trusted, want the old and the staged", len(trusted))
			}
			if !bytes.Equal(unsealActive(t, b, kek, k), pubDER(t, b, k)) {
				t.Fatal("active key does not unseal to its public half")
			}

			clk.Advance(time.Hour)
			if _, err = RotateActivate(dir, kek, k, clk); err != nil {
				t.Fatal(err)
			}
			if b, err = Load(dir); err != nil {
				t.Fatalf("reload after activate: %v", err)
			}
			if bytes.Equal(activeID(b, k), old) || !contains(trusted, activeID(b, k)) {
				t.Fatal("activate did not make the staged key active")
			}
			if !bytes.Equal(unsealActive(t, b, kek, k), pubDER(t, b, k)) {
				t.Fatal("new active key does not unseal to its public half")
			}
			if after := trustedIDs(t, b, k); len(after) != 2 || !contains(after, old) {
				t.Fatal("after activate the previous key is not trusted")
			}

			clk.Advance(RetireAfter - time.Second)
			if _, err := RotateRetire(dir, k, clk, false); !errors.Is(err, ErrTooEarly) {
				t.Fatalf("retire before RetireAfter: %v, want ErrTooEarly", err)
			}
			clk.Advance(time.Second)
			if _, err := RotateRetire(dir, k, clk, false); err != nil {
				t.Fatal(err)
			}
			if b, err = Load(dir); err != nil {
				t.Fatalf("reload after retire: %v", err)
			}
			after := trustedIDs(t, b, k)
			if k == KindAuditKey {
				if len(after) != 2 || !contains(after, old) {
					t.Fatal("a retired audit key must stay a verifier")
				}
			} else if len(after) != 1 || contains(after, old) {
				t.Fatalf("after retire %d keys trusted, the old one included: %v", len(after), contains(after, old))
			}
			if len(b.sealed) != len(keyNames)+1 { // and the break-glass SSH CA
				t.Fatalf("after retire %d sealed keys, want %d", len(b.sealed), len(keyNames)+1)
			}
		})
	}
}

// TestRotateRefusesOutOfOrder: each step refuses when the bundle is not in
// the state it needs, by its exact error, and changes nothing.
func TestRotateRefusesOutOfOrder(t *testing.T) {
	_, kek, dir := newBundle(t)
	clk := clock.NewFake(t0.Add(time.Hour))
	before, _ := os.ReadFile(filepath.Join(dir, BundleFile))
	if _, err := RotateActivate(dir, kek, KindNodeCA, clk); !errors.Is(err, ErrNothingStaged) {
		t.Fatalf("activate with nothing staged: %v", err)
	}
	if _, err := RotateRetire(dir, KindNodeCA, clk, true); !errors.Is(err, ErrNothingToRetire) {
		t.Fatalf("retire with no previous: %v", err)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, BundleFile)); !bytes.Equal(before, after) {
		t.Fatal("a refused step rewrote the bundle")
	}
	if _, err := RotateStage(dir, kek, KindNodeCA, clk); err != nil {
		t.Fatal(err)
	}
	if _, err := RotateStage(dir, kek, KindNodeCA, clk); !errors.Is(err, ErrAlreadyStaged) {
		t.Fatalf("second stage: %v", err)
	}
	if _, err := RotateActivate(dir, kek, KindNodeCA, clk); err != nil {
		t.Fatal(err)
	}
	if _, err := RotateStage(dir, kek, KindNodeCA, clk); err != nil {
		t.Fatal(err)
	}
	if _, err := RotateActivate(dir, kek, KindNodeCA, clk); !errors.Is(err, ErrPreviousKept) {
		t.Fatalf("activate over a kept previous key: %v", err)
	}
	if _, err := RotateStage(dir, testKEK(9), KindJoinKey, clk); err != nil {
		t.Fatal(err) // staging seals only: a wrong KEK is caught on activate
	}
	if _, err := RotateActivate(dir, kek, KindJoinKey, clk); !errors.Is(err, ErrSealBroken) {
		t.Fatalf("activate a key sealed under another KEK: %v, want ErrSealBroken", err)
	}
}

// TestRotatePrivateHalves: activation deletes the replaced key's private
// half, except the join key's (it still signs bundles for nodes and tokens
// pinning it), which retire deletes.
func TestRotatePrivateHalves(t *testing.T) {
	_, kek, dir := newBundle(t)
	clk := clock.NewFake(t0.Add(time.Hour))
	for _, k := range Kinds {
		if _, err := RotateStage(dir, kek, k, clk); err != nil {
			t.Fatal(err)
		}
		if _, err := RotateActivate(dir, kek, k, clk); err != nil {
			t.Fatal(err)
		}
	}
	b, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range Kinds {
		_, kept := b.sealed[previousName(k)]
		if kept != (k == KindJoinKey) {
			t.Errorf("%s: previous private half kept = %v", k, kept)
		}
	}
	keys, err := b.JoinSigningKeys(kek)
	if err != nil || len(keys) != 2 {
		t.Fatalf("join signing keys: %d, %v", len(keys), err)
	}
	for i, pub := range b.JoinKeys() {
		if !pub.Equal(keys[i].Public()) {
			t.Fatalf("join signing key %d does not match JoinKeys", i)
		}
	}
	if _, err := RotateRetire(dir, KindJoinKey, clk, true); err != nil {
		t.Fatal(err)
	}
	if b, err = Load(dir); err != nil {
		t.Fatal(err)
	}
	if _, kept := b.sealed[previousName(KindJoinKey)]; kept {
		t.Fatal("retire kept the previous join key's private half")
	}
}

// TestRotateIssuedAtMovesForward: every step stamps a strictly later
// issued_at, even with a clock that went back, so nodes take the result.
func TestRotateIssuedAtMovesForward(t *testing.T) {
	b, kek, dir := newBundle(t)
	last := b.TrustBundle(t0).IssuedAt
	clk := clock.NewFake(t0.Add(-time.Hour))
	for _, step := range []func() (*Bundle, error){
		func() (*Bundle, error) { return RotateStage(dir, kek, KindInternalCA, clk) },
		func() (*Bundle, error) { return RotateActivate(dir, kek, KindInternalCA, clk) },
		func() (*Bundle, error) { return RotateRetire(dir, KindInternalCA, clk, true) },
	} {
		nb, err := step()
		if err != nil {
			t.Fatal(err)
		}
		got := nb.TrustBundle(t0.Add(time.Hour)).IssuedAt
		if got <= last {
			t.Fatalf("issued_at %d after %d", got, last)
		}
		last = got
	}
}

// TestLoadRefusesSealedMismatch: a staged key without its sealed private
// half, or a sealed entry nothing names, is refused at load.
func TestLoadRefusesSealedMismatch(t *testing.T) {
	_, kek, dir := newBundle(t)
	clk := clock.NewFake(t0)
	if _, err := RotateStage(dir, kek, KindCommandRoot, clk); err != nil {
		t.Fatal(err)
	}
	b, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, BundleFile)
	delete(b.sealed, stagedName(KindCommandRoot))
	if err := b.write(path, false); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); err == nil || !bytes.Contains([]byte(err.Error()), []byte("sealed staged/command-root missing")) {
		t.Fatalf("load without the staged key's sealed half: %v", err)
	}
	b.sealed[stagedName(KindCommandRoot)] = []byte{1}
	b.sealed["previous/node-ca"] = []byte{1}
	if err := b.write(path, false); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); err == nil || !bytes.Contains([]byte(err.Error()), []byte("unexpected sealed entries")) {
		t.Fatalf("load with an extra sealed entry: %v", err)
	}
}

// TestStagedKeyNeverInTheClear: a staged key's private half is in the
// bundle only sealed, in the file and in what `pki show` prints.
func TestStagedKeyNeverInTheClear(t *testing.T) {
	_, kek, dir := newBundle(t)
	clk := clock.NewFake(t0)
	for _, k := range Kinds {
		if _, err := RotateStage(dir, kek, k, clk); err != nil {
			t.Fatal(err)
		}
	}
	b, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	secrets := map[string][]byte{}
	for _, k := range Kinds {
		der, err := Open(kek, b.sealed[stagedName(k)], []byte("bc-pki/"+stagedName(k)))
		if err != nil {
			t.Fatal(err)
		}
		secrets[string(k)] = der
	}
	data, err := os.ReadFile(filepath.Join(dir, BundleFile))
	if err != nil {
		t.Fatal(err)
	}
	for name, der := range secrets {
		if bytes.Contains(data, der) || bytes.Contains([]byte(b.Show().String()), der) {
			t.Fatalf("staged %s private key in the clear", name)
		}
	}
}

// signedBy encodes tb and signs it with every key of b's that kek unseals.
func signedBy(t *testing.T, b *Bundle, kek KEK) ([]byte, []JoinSignature) {
	t.Helper()
	body, err := EncodeTrustBundle(b.TrustBundle(t0))
	if err != nil {
		t.Fatal(err)
	}
	keys, err := b.JoinSigningKeys(kek)
	if err != nil {
		t.Fatal(err)
	}
	var sigs []JoinSignature
	for _, k := range keys {
		sigs = append(sigs, JoinSignature{Key: k.Public().(ed25519.PublicKey), Sig: SignTrustBundle(k, body)})
	}
	return body, sigs
}

// TestRefreshAcrossJoinKeyRotation: a node pinning the old join key takes
// the staged bundle (signed by both), pins both from its join_keys, takes
// the activated bundle through the new key and, after retire, pins the new
// key alone; a bundle signed only by a key it never pinned is refused.
func TestRefreshAcrossJoinKeyRotation(t *testing.T) {
	b0, kek, dir := newBundle(t)
	clk := clock.NewFake(t0.Add(time.Hour))
	body0, sigs0 := signedBy(t, b0, kek)
	cur, used, err := VerifyTrustBundleAny(body0, sigs0, [][32]byte{JoinKeyPin(b0.JoinKey)})
	if err != nil {
		t.Fatal(err)
	}
	pins := cur.Pins(used.Key)
	if len(pins) != 1 {
		t.Fatalf("pins before rotation: %d", len(pins))
	}
	step := func(b *Bundle, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		body, sigs := signedBy(t, b, kek)
		next, used, err := VerifyTrustBundleAny(body, sigs, pins)
		if err != nil {
			t.Fatalf("refresh: %v", err)
		}
		if err := CheckRefresh(cur, next); err != nil {
			t.Fatalf("refresh: %v", err)
		}
		cur, pins = next, next.Pins(used.Key)
	}
	step(RotateStage(dir, kek, KindJoinKey, clk))
	if len(pins) != 2 {
		t.Fatalf("pins while staged: %d, want 2", len(pins))
	}
	step(RotateActivate(dir, kek, KindJoinKey, clk))
	// Only the new (active) key's signature: the node must have pinned it.
	b, _ := Load(dir)
	body, sigs := signedBy(t, b, kek)
	if _, k, err := VerifyTrustBundleAny(body, sigs[:1], pins); err != nil || !k.Key.Equal(b.JoinKey) {
		t.Fatalf("new key's signature alone: %v", err)
	}
	step(RotateRetire(dir, KindJoinKey, clk, true))
	if b, _ = Load(dir); len(pins) != 1 || pins[0] != JoinKeyPin(b.JoinKey) {
		t.Fatal("after retire the node should pin the new join key alone")
	}
	if _, _, err := VerifyTrustBundleAny(body0, sigs0, pins); err == nil || err.Error() != "pki: no signature by a pinned join key" {
		t.Fatalf("bundle signed by the retired key only: %v", err)
	}
}

// TestCheckRefresh: a refresh never goes back and never changes the trust
// domain, the deployment, the approvers or the threshold.
func TestCheckRefresh(t *testing.T) {
	b, _, _ := newBundle(t)
	cur := b.TrustBundle(t0)
	cur.Approvers, cur.Threshold = [][]byte{bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)}, 2
	newer := func(f func(*TrustBundle)) TrustBundle {
		n := cur
		n.IssuedAt++
		f(&n)
		return n
	}
	cases := []struct {
		name string
		next TrustBundle
		want error
	}{
		{"newer", newer(func(*TrustBundle) {}), nil},
		{"same", cur, ErrBundleNotNewer},
		{"older", newer(func(n *TrustBundle) { n.IssuedAt -= 2 }), ErrBundleNotNewer},
		{"other trust domain", newer(func(n *TrustBundle) { n.TrustDomain = "other.bc.local" }), ErrBundleChangesPins},
		{"other deployment", newer(func(n *TrustBundle) { n.Deployment = "other" }), ErrBundleChangesPins},
		{"threshold lowered", newer(func(n *TrustBundle) { n.Threshold = 1 }), ErrBundleChangesPins},
		{"approver replaced", newer(func(n *TrustBundle) { n.Approvers = [][]byte{n.Approvers[0], bytes.Repeat([]byte{3}, 32)} }), ErrBundleChangesPins},
		{"approvers dropped", newer(func(n *TrustBundle) { n.Approvers, n.Threshold = nil, 0 }), ErrBundleChangesPins},
	}
	for _, c := range cases {
		if err := CheckRefresh(cur, c.next); !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
}
