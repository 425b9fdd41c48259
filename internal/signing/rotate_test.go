package signing_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/signing"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// TestWorkerKeyFollowsCommandRoot: once the command root rotates, a worker
// makes a key certified by the new root instead of signing on with one the
// old root certified; a worker still on the old root (a process not yet
// restarted) keeps its own root's key rather than take the new one.
func TestWorkerKeyFollowsCommandRoot(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		t0 := time.Now()
		clk := clock.NewFake(t0)
		kek, err := pki.CreateKEK(filepath.Join(t.TempDir(), "kek"))
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(t.TempDir(), "pki")
		old, err := pki.Init(dir, "rot.bc.local", kek, clock.NewFake(t0.Add(-48*time.Hour)))
		if err != nil {
			t.Fatal(err)
		}
		signer := func(b *pki.Bundle) *signing.Signer {
			rk, err := b.CommandRootKey(kek)
			if err != nil {
				t.Fatal(err)
			}
			return signing.New(signing.Deps{DB: db, Commands: commands.NewStore(db), Clock: clk, KEK: kek, Root: b.CommandRoot, RootKey: rk,
				TrustDomain: b.TrustDomain, Bus: bus.New(), Batches: noBatches{}, Log: slog.New(slog.DiscardHandler)})
		}
		before, err := signer(old).CurrentKey(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pki.RotateStage(dir, kek, pki.KindCommandRoot, clk); err != nil {
			t.Fatal(err)
		}
		rotated, err := pki.RotateActivate(dir, kek, pki.KindCommandRoot, clk)
		if err != nil {
			t.Fatal(err)
		}
		after, err := signer(rotated).CurrentKey(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if after == before {
			t.Fatal("after the command root rotated the worker kept the key the old root certified")
		}
		if again, err := signer(old).CurrentKey(ctx); err != nil || again != before {
			t.Fatalf("a worker on the old root took %s (err %v), want its own key %s", again, err, before)
		}
		if again, err := signer(rotated).CurrentKey(ctx); err != nil || again != after {
			t.Fatalf("the new root's worker made another key %s (err %v), want %s", again, err, after)
		}
	})
}
