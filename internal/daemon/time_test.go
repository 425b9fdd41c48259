package daemon

import (
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// timeSigner returns a function that signs a time statement for at with a
// fresh worker key certified at at (minus a minute) by root.
func timeSigner(t testing.TB, b *pki.Bundle, kek pki.KEK) func(at time.Time) *nodev1.SignedTimeStatement {
	t.Helper()
	return timeSignerUnder(t, b, kek, wire.TimeSigContext)
}

// timeSignerUnder is timeSigner with the signature context sigCtx.
func timeSignerUnder(t testing.TB, b *pki.Bundle, kek pki.KEK, sigCtx string) func(at time.Time) *nodev1.SignedTimeStatement {
	t.Helper()
	rk, err := b.CommandRootKey(kek)
	if err != nil {
		t.Fatal(err)
	}
	return func(at time.Time) *nodev1.SignedTimeStatement {
		pub, priv, _ := ed25519.GenerateKey(rand.Reader)
		cert, err := pki.IssueWorkerCert(b.CommandRoot, rk, b.TrustDomain, "wt", pub, 24*time.Hour, at.Add(-time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		body, err := proto.Marshal(&nodev1.TimeStatement{ServerTimeMs: at.UnixMilli(), Nonce: "n", TrustDomain: b.TrustDomain})
		if err != nil {
			t.Fatal(err)
		}
		return &nodev1.SignedTimeStatement{Body: body, Signature: ed25519.Sign(priv, append([]byte(sigCtx), body...)), SignerCertDer: cert}
	}
}

// savedHighest returns the highest statement time the node persisted (0
// when it saved none).
func savedHighest(t *testing.T, n *Node) int64 {
	t.Helper()
	var st state
	if err := readJSON(n.cfg.DataDir, stateFile, &st); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return st.HighestServerTimeMS
}

// TestNodeTimeComesFromSignedStatements replays issue 14 item 4. The time
// a node trusts beyond its own clock comes only from a statement a worker
// signed, as a lower bound counted on by the node's own clock: the
// Welcome's unsigned server time is never read, an old statement cannot
// move the node's time back, a statement more than the allowed skew ahead
// is refused and not saved, and a forged one is ignored.
func TestNodeTimeComesFromSignedStatements(t *testing.T) {
	t.Run("old welcome does not revive an expired command", func(t *testing.T) {
		f := newFixture(t)
		n, sim, key := openTestNode(t, f, -1)
		past := f.now.Add(-270 * time.Second)
		// The gateway's clock says 4.5 minutes ago, and it relays a real
		// statement the workers signed then.
		w := &nodev1.Welcome{ServerTimeMs: past.UnixMilli(), Time: timeSigner(t, f.bundle, f.kek)(past)}
		if n.acceptWelcome(w) {
			t.Fatal("session marked rewound")
		}
		e := startExecutor(t, n, key, noSecrets)
		// Signed, and expired 10 s ago.
		e.work <- f.sign(f.body(func(b *nodev1.CommandBody) {
			b.IssuedAtMs = f.now.Add(-5 * time.Minute).UnixMilli()
			b.ExpiresAtMs = f.now.Add(-10 * time.Second).UnixMilli()
		}))
		wantUpdate(t, e.next(), "c1", "cancelled", ReasonExpired)
		e.finish()
		if sim.Runs(kinds.DiagRun) != 0 {
			t.Fatal("the expired command ran")
		}
		if got := n.now(); !got.Equal(f.now) {
			t.Fatalf("node time %v, want its own clock %v", got, f.now)
		}
	})

	t.Run("statement 30 days ahead is refused and not saved", func(t *testing.T) {
		f := newFixture(t)
		n, sim, key := openTestNode(t, f, -1)
		ahead := f.now.Add(30 * 24 * time.Hour)
		if n.acceptWelcome(&nodev1.Welcome{ServerTimeMs: ahead.UnixMilli(), Time: timeSigner(t, f.bundle, f.kek)(ahead)}) {
			t.Fatal("session marked rewound")
		}
		e := startExecutor(t, n, key, noSecrets)
		e.work <- command(f, "c1", kinds.DiagRun, []byte("{}"))
		wantUpdate(t, e.next(), "c1", "running", "")
		wantUpdate(t, e.next(), "c1", "succeeded", "")
		e.finish()
		if got := n.now(); !got.Equal(f.now) {
			t.Fatalf("node time %v, want its own clock %v", got, f.now)
		}
		if h := savedHighest(t, n); h != 0 {
			t.Fatalf("saved %d as the highest time", h)
		}
		// After a restart, a Welcome with today's signed time is not
		// taken for a rewind.
		n.Close()
		n2, err := Open(Config{DataDir: n.cfg.DataDir, Driver: sim, Clock: clock.NewFake(f.now), Log: n.cfg.Log, RunningAfter: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n2.Close() })
		if n2.acceptWelcome(&nodev1.Welcome{ServerTimeMs: f.now.UnixMilli(), Time: timeSigner(t, f.bundle, f.kek)(f.now)}) {
			t.Fatal("today's signed time taken for a rewind after the refused statement")
		}
		e2 := startExecutor(t, n2, key, noSecrets)
		e2.work <- command(f, "c2", kinds.DiagRun, []byte("{}"))
		wantUpdate(t, e2.next(), "c2", "running", "")
		wantUpdate(t, e2.next(), "c2", "succeeded", "")
		e2.finish()
	})

	t.Run("statement 10 minutes ahead sets the time and is not saved", func(t *testing.T) {
		f := newFixture(t)
		n, _, _ := openTestNode(t, f, -1)
		sign := timeSigner(t, f.bundle, f.kek)
		ahead := f.now.Add(10 * time.Minute)
		if n.acceptWelcome(&nodev1.Welcome{Time: sign(ahead)}) {
			t.Fatal("session marked rewound")
		}
		if got := n.now(); got.UnixMilli() != ahead.UnixMilli() {
			t.Fatalf("node time %v, want the statement's %v", got, ahead)
		}
		if h := savedHighest(t, n); h != 0 {
			t.Fatalf("saved %d as the highest time", h)
		}
		// Just past the correction bound: refused, the time stays.
		if n.acceptWelcome(&nodev1.Welcome{Time: sign(f.now.Add(MaxClockCorrection + time.Second))}) {
			t.Fatal("session marked rewound")
		}
		if got := n.now(); got.UnixMilli() != ahead.UnixMilli() {
			t.Fatalf("node time %v after a statement past the bound, want %v", got, ahead)
		}
	})

	t.Run("forged statements are ignored", func(t *testing.T) {
		f := newFixture(t)
		foreignKEK, err := pki.CreateKEK(filepath.Join(t.TempDir(), "kek"))
		if err != nil {
			t.Fatal(err)
		}
		foreign, err := pki.Init(filepath.Join(t.TempDir(), "pki"), f.bundle.TrustDomain, foreignKEK, clock.NewFake(f.now.Add(-48*time.Hour)))
		if err != nil {
			t.Fatal(err)
		}
		soon := f.now.Add(3 * time.Minute) // within the skew: a real one would be taken
		good := timeSigner(t, f.bundle, f.kek)
		cases := map[string]*nodev1.SignedTimeStatement{
			"foreign root": timeSigner(t, foreign, foreignKEK)(soon),
			"unsigned":     {Body: good(soon).Body},
			"bad signature": func() *nodev1.SignedTimeStatement {
				st := good(soon)
				st.Signature[0] ^= 1
				return st
			}(),
			// A real worker key, signing under the command context.
			"command signature context": timeSignerUnder(t, f.bundle, f.kek, wire.CommandSigContext)(soon),
			"garbage body":              {Body: []byte{0xff}, Signature: good(soon).Signature, SignerCertDer: good(soon).SignerCertDer},
			"no statement":              nil,
		}
		for name, st := range cases {
			t.Run(name, func(t *testing.T) {
				n, _, _ := openTestNode(t, f, -1)
				if n.acceptWelcome(&nodev1.Welcome{ServerTimeMs: soon.UnixMilli(), Time: st}) {
					t.Fatal("session marked rewound")
				}
				if got := n.now(); !got.Equal(f.now) {
					t.Fatalf("node time %v, want its own clock %v", got, f.now)
				}
				if h := savedHighest(t, n); h != 0 {
					t.Fatalf("saved %d as the highest time", h)
				}
			})
		}
	})

	t.Run("real statement only moves time forward", func(t *testing.T) {
		f := newFixture(t)
		n, _, _ := openTestNode(t, f, -1)
		sign := timeSigner(t, f.bundle, f.kek)
		soon := f.now.Add(3 * time.Minute)
		if n.acceptWelcome(&nodev1.Welcome{Time: sign(soon)}) {
			t.Fatal("session marked rewound")
		}
		if got := n.now(); got.UnixMilli() != soon.UnixMilli() {
			t.Fatalf("node time %v, want the statement's %v", got, soon)
		}
		if h := savedHighest(t, n); h != soon.UnixMilli() {
			t.Fatalf("saved %d, want %d", h, soon.UnixMilli())
		}
		n.cfg.Clock.(*clock.Fake).Advance(time.Minute)
		if got, want := n.now(), soon.Add(time.Minute); got.UnixMilli() != want.UnixMilli() {
			t.Fatalf("node time %v a minute later, want %v", got, want)
		}
		// An older statement (within the skew) changes nothing.
		if n.acceptWelcome(&nodev1.Welcome{Time: sign(f.now.Add(-time.Minute))}) {
			t.Fatal("session marked rewound")
		}
		if got, want := n.now(), soon.Add(time.Minute); got.UnixMilli() != want.UnixMilli() {
			t.Fatalf("node time %v after an older statement, want %v", got, want)
		}
		// One more than the skew behind the highest accepted: rewound.
		if !n.acceptWelcome(&nodev1.Welcome{Time: sign(soon.Add(-MaxSkew - time.Second))}) {
			t.Fatal("an old statement replayed was not taken for a rewind")
		}
	})
}

// FuzzCheckTime feeds arbitrary time statements to the verifier: it must
// never panic and never accept one the worker key did not sign.
func FuzzCheckTime(f *testing.F) {
	fx := newFixture(f)
	good := timeSigner(f, fx.bundle, fx.kek)(fx.now)
	f.Add(good.Body, good.Signature, good.SignerCertDer)
	f.Add([]byte{}, []byte{1}, []byte{2})
	f.Add(good.Body[:len(good.Body)/2], good.Signature, good.SignerCertDer)
	f.Fuzz(func(t *testing.T, body, sig, cert []byte) {
		at, err := fx.v.CheckTime(&nodev1.SignedTimeStatement{Body: body, Signature: sig, SignerCertDer: cert})
		if err == nil && !(string(sig) == string(good.Signature) && string(body) == string(good.Body)) {
			t.Fatalf("accepted a statement the worker did not sign: %v", at)
		}
	})
}
