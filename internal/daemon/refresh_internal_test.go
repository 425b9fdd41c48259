package daemon

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// refreshFixture is a pinned bundle and its join key, made once per fuzz run.
type refreshFixture struct {
	tb      pki.TrustBundle
	body    []byte
	joinKey ed25519.PrivateKey
}

func newRefreshFixture(t testing.TB) refreshFixture {
	t.Helper()
	dir := t.TempDir()
	kek, err := pki.CreateKEK(filepath.Join(dir, "kek"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := pki.Init(filepath.Join(dir, "pki"), "fuzz.bc.local", kek, clock.NewFake(time.Unix(1_700_000_000, 0)))
	if err != nil {
		t.Fatal(err)
	}
	key, err := b.JoinSigningKey(kek)
	if err != nil {
		t.Fatal(err)
	}
	tb := b.TrustBundle(time.Time{})
	body, err := pki.EncodeTrustBundle(tb)
	if err != nil {
		t.Fatal(err)
	}
	return refreshFixture{tb: tb, body: body, joinKey: key}
}

// node returns a node pinning the fixture's bundle, with its data in dir.
func (f refreshFixture) node(t testing.TB, dir string) *Node {
	t.Helper()
	roots, err := f.tb.CommandRootCerts()
	if err != nil {
		t.Fatal(err)
	}
	pub := f.joinKey.Public().(ed25519.PublicKey)
	pin := pki.JoinKeyPin(pub)
	rec := JoinRecord{NodeID: "n1", Pin: pin[:], JoinPublicKey: pub, BundleBody: f.body, BundleSig: pki.SignTrustBundle(f.joinKey, f.body)}
	return &Node{cfg: Config{DataDir: dir, Log: slog.New(slog.DiscardHandler)}, rec: &rec, pinned: newPinnedTrust(rec, f.tb, roots)}
}

// FuzzOfferTrustBundle offers arbitrary signed bundles to a node: whatever
// it takes must be signed by the pinned join key and pass CheckRefresh
// over the pinned bundle, the record written must verify under that key,
// and a refusal writes nothing.
func FuzzOfferTrustBundle(f *testing.F) {
	fx := newRefreshFixture(f)
	newer := fx.tb
	newer.IssuedAt++
	newerBody, err := pki.EncodeTrustBundle(newer)
	if err != nil {
		f.Fatal(err)
	}
	pub := []byte(fx.joinKey.Public().(ed25519.PublicKey))
	f.Add(newerBody, pki.SignTrustBundle(fx.joinKey, newerBody), pub, []byte(nil), []byte(nil))
	f.Add(fx.body, pki.SignTrustBundle(fx.joinKey, fx.body), pub, []byte(nil), []byte(nil))
	f.Add(newerBody, []byte("sig"), []byte("key"), pub, pki.SignTrustBundle(fx.joinKey, newerBody))
	f.Add([]byte("{}"), []byte{}, []byte{}, []byte{}, []byte{})
	f.Fuzz(func(t *testing.T, body, sig, key, otherKey, otherSig []byte) {
		dir := t.TempDir()
		n := fx.node(t, dir)
		sb := &nodev1.SignedTrustBundle{Body: body, Signature: sig, JoinPublicKey: key}
		if otherKey != nil {
			sb.OtherSignatures = []*nodev1.JoinKeySignature{{JoinPublicKey: otherKey, Signature: otherSig}}
		}
		err := n.OfferTrustBundle(sb)
		_, statErr := os.Stat(filepath.Join(dir, joinFile))
		if err != nil {
			if !errors.Is(err, ErrRefreshUnverified) && !errors.Is(err, pki.ErrBundleNotNewer) && !errors.Is(err, pki.ErrBundleChangesPins) {
				t.Fatalf("refusal without its error: %v", err)
			}
			if statErr == nil {
				t.Fatal("a refused bundle was written")
			}
			return
		}
		rec, got, err := readJoin(dir)
		if err != nil {
			t.Fatalf("written record does not load: %v", err)
		}
		if !bytes.Equal(rec.JoinPublicKey, pub) || !bytes.Equal(rec.BundleBody, body) || pki.CheckRefresh(fx.tb, got) != nil {
			t.Fatal("took a bundle not signed by the pinned key, or not a valid refresh")
		}
		if _, tb := n.pinned.get(); tb.IssuedAt != got.IssuedAt {
			t.Fatal("the node does not use the bundle it wrote")
		}
	})
}
