package desiredstate_test

import (
	"crypto/ed25519"
	"errors"
	"testing"

	"github.com/bettercompute/bettercompute/internal/desiredstate"
	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
	"github.com/bettercompute/bettercompute/internal/pki"
)

// FuzzCheck feeds arbitrary intent and bundle bytes (both come from the
// node, which the helper does not trust) to a checker with real pins. It
// must never panic, every refusal must be a *helperwire.Refusal, and
// whatever passes must name the node and not rewind the generation.
func FuzzCheck(f *testing.F) {
	w := newWorld(f, "fuzz.bc.local")
	c, err := desiredstate.New(desiredstate.Config{PinnedRootSHA256: [][32]byte{pin(w.b.CommandRoot)},
		JoinKeyPin: w.joinKey.Public().(ed25519.PublicKey), NodeID: func() string { return "n1" }, StateDir: f.TempDir(),
		WorkerChains: pki.NewWorkerChainCache(0)})
	if err != nil {
		f.Fatal(err)
	}
	good, bundle := w.intent("n1", 3), w.bundle(f, 100)
	f.Add(good, bundle)
	f.Add(good, []byte(nil))
	f.Add(w.intent("n2", 4), bundle)
	f.Add([]byte{}, bundle)
	var highest uint64
	f.Fuzz(func(t *testing.T, intent, bundle []byte) {
		ds, err := c.Check(intent, bundle)
		if err != nil {
			var r *helperwire.Refusal
			if !errors.As(err, &r) || r.Code == "" {
				t.Fatalf("not a refusal: %v", err)
			}
			return
		}
		if ds.NodeId != "n1" || ds.Generation < highest {
			t.Fatalf("passed: node %q generation %d (highest %d)", ds.NodeId, ds.Generation, highest)
		}
		highest = ds.Generation
	})
}
