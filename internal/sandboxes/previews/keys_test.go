package previews_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/sandboxes/previews"
	"github.com/bettercompute/bettercompute/internal/sandboxes/previewtoken"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

func newKEK(t *testing.T) pki.KEK {
	t.Helper()
	var k pki.KEK
	if _, err := rand.Read(k[:]); err != nil {
		t.Fatal(err)
	}
	return k
}

// TestPreviewKeySealedAndRotated: the preview key is made once and kept
// sealed under the KEK (its seed is nowhere in the row); rotating it
// (previews.rotateKey, an audit row) makes every token of the old key
// refused as preview-unknown-key while the new key's verify; a KEK
// rotation re-seals it.
func TestPreviewKeySealedAndRotated(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		clk := clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
		kek := newKEK(t)
		keys := previews.NewKeys(db, kek, clk)
		// The proxy's unauthenticated requests never make the key.
		if _, err := keys.Verifier(ctx); err == nil {
			t.Fatal("a verifier with no key made yet")
		}
		var made int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM sandbox_preview_keys`).Scan(&made); err != nil || made != 0 {
			t.Fatalf("the verifier made a key: %d %v", made, err)
		}
		k1, err := keys.Signing(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if again, err := keys.Signing(ctx); err != nil || again.ID() != k1.ID() {
			t.Fatalf("a second read made another key: %v %v", again.ID(), err)
		}
		var sealed, public []byte
		if err := db.QueryRowContext(ctx, `SELECT sealed, public_key FROM sandbox_preview_keys`).Scan(&sealed, &public); err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(sealed, k1.MarshalSeed()) || bytes.Contains(public, k1.MarshalSeed()) {
			t.Fatal("the preview key's seed is stored in the clear")
		}
		claims := previewtoken.Claims{SandboxID: "sb-one", Port: 8080, Expires: clk.Now().Add(time.Hour), TenantID: "t-acme"}
		old, err := previewtoken.Issue(k1, claims, clk.Now(), previews.MaxTTL)
		if err != nil {
			t.Fatal(err)
		}
		v, err := keys.Verifier(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := v.Verify(old, clk.Now(), "sb-one", 8080); err != nil {
			t.Fatalf("the current key's token: %v", err)
		}
		svc := previews.New(db, keys, nil, clk, func() string { return "" })
		kid, err := svc.RotateKey(ctx, audit.Entry{Actor: "admin"})
		if err != nil || kid == k1.ID() {
			t.Fatalf("rotate: %q %v", kid, err)
		}
		var n int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit_events WHERE action = $1 AND outcome = 'allowed'`, previews.ActionRotateKey).Scan(&n); err != nil || n != 1 {
			t.Fatalf("rotation audit rows: %d %v", n, err)
		}
		v, err = keys.Verifier(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var re *previewtoken.RefusedError
		if _, err := v.Verify(old, clk.Now(), "sb-one", 8080); !errors.As(err, &re) || re.Reason != previewtoken.ReasonUnknownKey {
			t.Fatalf("the old key's token after rotation: %v", err)
		}
		k2, err := keys.Signing(ctx)
		if err != nil || k2.ID() != kid {
			t.Fatalf("signing key after rotation: %v %v", k2.ID(), err)
		}
		// A KEK rotation re-seals it, once.
		next := newKEK(t)
		if c, err := previews.Reseal(ctx, db, kek, next); err != nil || c.Resealed != 1 {
			t.Fatalf("reseal: %+v %v", c, err)
		}
		if c, err := previews.Reseal(ctx, db, kek, next); err != nil || c.AlreadyDone != 1 {
			t.Fatalf("reseal again: %+v %v", c, err)
		}
		if k, err := previews.NewKeys(db, next, clk).Signing(ctx); err != nil || k.ID() != kid {
			t.Fatalf("under the new KEK: %v %v", k.ID(), err)
		}
		if _, err := keys.Signing(ctx); err == nil {
			t.Fatal("the old KEK still opens the re-sealed key")
		}
	})
}
