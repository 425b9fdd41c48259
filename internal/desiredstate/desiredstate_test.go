package desiredstate_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/desiredstate"
	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// world is a real PKI (pki.Init) with its join key and a worker key the
// command root certified, as the control plane has them.
type world struct {
	now      time.Time
	b        *pki.Bundle
	joinKey  ed25519.PrivateKey
	rootKey  ed25519.PrivateKey
	workerPK ed25519.PrivateKey
	worker   []byte // worker certificate DER
}

func newWorld(t testing.TB, td string) world {
	t.Helper()
	now := time.Now()
	kek, err := pki.CreateKEK(filepath.Join(t.TempDir(), "kek"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := pki.Init(filepath.Join(t.TempDir(), "pki"), td, kek, clock.NewFake(now.Add(-48*time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	rk, err := b.CommandRootKey(kek)
	if err != nil {
		t.Fatal(err)
	}
	jk, err := b.JoinSigningKey(kek)
	if err != nil {
		t.Fatal(err)
	}
	w := world{now: now, b: b, joinKey: jk, rootKey: rk}
	w.workerPK, w.worker = w.newWorker(t, b.CommandRoot, rk)
	return w
}

// newWorker certifies a fresh worker key under root.
func (w world) newWorker(t testing.TB, root *x509.Certificate, rootKey ed25519.PrivateKey) (ed25519.PrivateKey, []byte) {
	t.Helper()
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	cert, err := pki.IssueWorkerCert(root, rootKey, w.b.TrustDomain, "w1", pub, 24*time.Hour, w.now.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return priv, cert
}

// bundle is the world's trust bundle issued at issuedAt with the given
// command roots (the world's own when none), signed by the join key.
func (w world) bundle(t testing.TB, issuedAt int64, roots ...*x509.Certificate) []byte {
	t.Helper()
	tb := w.b.TrustBundle(w.now)
	tb.IssuedAt = issuedAt
	if len(roots) > 0 {
		tb.CommandRoots = nil
		for _, r := range roots {
			tb.CommandRoots = append(tb.CommandRoots, r.Raw)
		}
	}
	body, err := pki.EncodeTrustBundle(tb)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := proto.Marshal(&nodev1.SignedTrustBundle{Body: body, Signature: pki.SignTrustBundle(w.joinKey, body), JoinPublicKey: w.joinKey.Public().(ed25519.PublicKey)})
	return raw
}

// intent is a desired state for node at gen, signed by key with cert.
func (w world) intentBy(key ed25519.PrivateKey, cert []byte, node string, gen uint64, mut func(*nodev1.DesiredState)) []byte {
	ds := &nodev1.DesiredState{NodeId: node, Generation: gen, TrustDomain: w.b.TrustDomain, IssuedAtMs: w.now.UnixMilli(),
		Host: &nodev1.HostSection{Role: pki.RoleNode, AllowedKinds: []string{"sandbox.create"}}}
	if mut != nil {
		mut(ds)
	}
	body, _ := proto.MarshalOptions{Deterministic: true}.Marshal(ds)
	raw, _ := proto.Marshal(&nodev1.SignedDesiredState{Body: body, Signature: ed25519.Sign(key, append([]byte(wire.DesiredStateSigContext), body...)), SignerCertDer: cert})
	return raw
}

func (w world) intent(node string, gen uint64) []byte {
	return w.intentBy(w.workerPK, w.worker, node, gen, nil)
}

func pin(c *x509.Certificate) [32]byte { return sha256.Sum256(c.Raw) }

func newChecker(t testing.TB, cfg desiredstate.Config) *desiredstate.Checker {
	t.Helper()
	if cfg.StateDir == "" {
		cfg.StateDir = t.TempDir()
	}
	c, err := desiredstate.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// wantCode asserts err is a *helperwire.Refusal with code.
func wantCode(t testing.TB, err error, code string) {
	t.Helper()
	var r *helperwire.Refusal
	if !errors.As(err, &r) || r.Code != code {
		t.Fatalf("got %v, want refusal %s", err, code)
	}
}

func TestCheckAcceptsAndRefusesEachCode(t *testing.T) {
	w := newWorld(t, "ds.bc.local")
	cfg := desiredstate.Config{PinnedRootSHA256: [][32]byte{pin(w.b.CommandRoot)}, JoinKeyPin: w.joinKey.Public().(ed25519.PublicKey),
		NodeID: func() string { return "n1" }}
	c := newChecker(t, cfg)
	b := w.bundle(t, 100)
	// No roots held yet: a request without a desired state is refused.
	_, err := c.Check(nil, nil)
	wantCode(t, err, helperwire.CodeIntentMissing)
	ds, err := c.Check(w.intent("n1", 5), b)
	if err != nil {
		t.Fatalf("good desired state refused: %v", err)
	}
	if ds.Generation != 5 || ds.Host.GetRole() != pki.RoleNode {
		t.Fatalf("body = %v", ds)
	}
	// Roots are held now: later calls need no bundle.
	if _, err := c.Check(w.intent("n1", 5), nil); err != nil {
		t.Fatalf("same generation refused: %v", err)
	}
	otherRootKey, otherRoot := otherCommandRoot(t, w)
	unpinnedKey, unpinnedCert := w.newWorker(t, otherRoot, otherRootKey)
	badSig := w.intent("n1", 6)
	var sd nodev1.SignedDesiredState
	_ = proto.Unmarshal(badSig, &sd)
	sd.Signature[0] ^= 1
	badSig, _ = proto.Marshal(&sd)
	// A command signature (other context) over the same body.
	var cmdCtx nodev1.SignedDesiredState
	_ = proto.Unmarshal(w.intent("n1", 6), &cmdCtx)
	cmdCtx.Signature = ed25519.Sign(w.workerPK, append([]byte(wire.CommandSigContext), cmdCtx.Body...))
	cmdCtxRaw, _ := proto.Marshal(&cmdCtx)
	// The command root itself signing (a CA, not a worker certificate).
	rootSigned := w.intentBy(w.rootKey, w.b.CommandRoot.Raw, "n1", 6, nil)
	for _, tc := range []struct {
		name, code string
		intent     []byte
	}{
		{"missing", helperwire.CodeIntentMissing, nil},
		{"malformed", helperwire.CodeIntentMalformed, []byte{0xff, 0xff, 0xff}},
		{"unsigned", helperwire.CodeIntentMalformed, w.intentBy(w.workerPK, nil, "n1", 6, nil)},
		{"unpinned-root", helperwire.CodeIntentUntrusted, w.intentBy(unpinnedKey, unpinnedCert, "n1", 6, nil)},
		{"not-a-worker", helperwire.CodeIntentUntrusted, rootSigned},
		{"other-trust-domain", helperwire.CodeIntentUntrusted, w.intentBy(w.workerPK, w.worker, "n1", 6, func(d *nodev1.DesiredState) { d.TrustDomain = "x.bc.local" })},
		{"signature", helperwire.CodeIntentSignature, badSig},
		{"command-context", helperwire.CodeIntentSignature, cmdCtxRaw},
		{"other-node", helperwire.CodeIntentOtherNode, w.intent("n2", 6)},
		{"rewound", helperwire.CodeIntentRewound, w.intent("n1", 4)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Check(tc.intent, nil)
			wantCode(t, err, tc.code)
		})
	}
}

// otherCommandRoot is the command root of another PKI of the same trust
// domain: a root nobody pinned.
func otherCommandRoot(t testing.TB, w world) (ed25519.PrivateKey, *x509.Certificate) {
	t.Helper()
	o := newWorld(t, w.b.TrustDomain)
	return o.rootKey, o.b.CommandRoot
}

func TestNoPinsRefusesEverything(t *testing.T) {
	w := newWorld(t, "ds.bc.local")
	c := newChecker(t, desiredstate.Config{})
	_, err := c.Check(w.intent("n1", 1), w.bundle(t, 100))
	wantCode(t, err, helperwire.CodeIntentUntrusted)
	_, err = c.Check(nil, nil)
	wantCode(t, err, helperwire.CodeIntentUntrusted)
}

func TestGenerationSurvivesRestart(t *testing.T) {
	w := newWorld(t, "ds.bc.local")
	dir := t.TempDir()
	cfg := desiredstate.Config{PinnedRootSHA256: [][32]byte{pin(w.b.CommandRoot)}, StateDir: dir}
	c := newChecker(t, cfg)
	if _, err := c.Check(w.intent("n1", 7), w.bundle(t, 100)); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, desiredstate.StateFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("state file: %v %v", fi, err)
	}
	// A new checker on the same directory: roots, node id (learnt on first
	// use) and generation are all remembered.
	c = newChecker(t, cfg)
	_, err = c.Check(w.intent("n1", 6), nil)
	wantCode(t, err, helperwire.CodeIntentRewound)
	_, err = c.Check(w.intent("n2", 8), nil)
	wantCode(t, err, helperwire.CodeIntentOtherNode)
	if _, err := c.Check(w.intent("n1", 8), nil); err != nil {
		t.Fatalf("newer generation refused after restart: %v", err)
	}
}

func TestBundleRotatesForwardOnly(t *testing.T) {
	w := newWorld(t, "ds.bc.local")
	newRootKey, newRoot := otherCommandRoot(t, w)
	newKey, newCert := w.newWorker(t, newRoot, newRootKey)
	join := w.joinKey.Public().(ed25519.PublicKey)
	// The join key vouches for the roots: no digest pinned.
	c := newChecker(t, desiredstate.Config{JoinKeyPin: join})
	if _, err := c.Check(w.intent("n1", 1), w.bundle(t, 100)); err != nil {
		t.Fatal(err)
	}
	// Not yet rotated: the new root's worker is not trusted.
	_, err := c.Check(w.intentBy(newKey, newCert, "n1", 2, nil), nil)
	wantCode(t, err, helperwire.CodeIntentUntrusted)
	// An older bundle naming the new root is refused, and changes nothing.
	_, err = c.Check(w.intentBy(newKey, newCert, "n1", 2, nil), w.bundle(t, 99, newRoot))
	wantCode(t, err, helperwire.CodeBundle)
	// A bundle signed by another join key is refused.
	o := newWorld(t, w.b.TrustDomain)
	_, err = c.Check(w.intent("n1", 2), o.bundle(t, 200, newRoot))
	wantCode(t, err, helperwire.CodeBundle)
	// A newer bundle with only the new root rotates: the new worker is
	// trusted and the old root's is not any more.
	if _, err := c.Check(w.intentBy(newKey, newCert, "n1", 2, nil), w.bundle(t, 101, newRoot)); err != nil {
		t.Fatalf("rotated root refused: %v", err)
	}
	_, err = c.Check(w.intent("n1", 3), nil)
	wantCode(t, err, helperwire.CodeIntentUntrusted)
	// And the old bundle can never come back.
	_, err = c.Check(w.intent("n1", 3), w.bundle(t, 100))
	wantCode(t, err, helperwire.CodeBundle)
}

func TestPinnedDigestsFilterBundleRoots(t *testing.T) {
	w := newWorld(t, "ds.bc.local")
	newRootKey, newRoot := otherCommandRoot(t, w)
	newKey, newCert := w.newWorker(t, newRoot, newRootKey)
	c := newChecker(t, desiredstate.Config{PinnedRootSHA256: [][32]byte{pin(w.b.CommandRoot)}, JoinKeyPin: w.joinKey.Public().(ed25519.PublicKey)})
	// A join-key-signed bundle naming both roots: only the pinned one counts.
	if _, err := c.Check(w.intent("n1", 1), w.bundle(t, 100, w.b.CommandRoot, newRoot)); err != nil {
		t.Fatal(err)
	}
	_, err := c.Check(w.intentBy(newKey, newCert, "n1", 2, nil), nil)
	wantCode(t, err, helperwire.CodeIntentUntrusted)
	// A newer bundle with no pinned root is refused; the roots held stay.
	_, err = c.Check(w.intent("n1", 2), w.bundle(t, 101, newRoot))
	wantCode(t, err, helperwire.CodeBundle)
	if _, err := c.Check(w.intent("n1", 2), nil); err != nil {
		t.Fatalf("pinned root lost: %v", err)
	}
}
