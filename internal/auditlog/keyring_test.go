package auditlog_test

import (
	"context"
	"crypto/ed25519"
	"slices"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/auditlog"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// TestAuditKeyRotation: after the audit key rotates, the sealer extends a
// log whose last checkpoint the old key signed (its verifier is the key
// ring), and a reader with the ring verifies the whole log clean; one with
// the new key alone finds the old checkpoints' signatures bad.
func TestAuditKeyRotation(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		f := newFixture(t, db, 4)
		f.record(t, iam.RootTenant, 6)
		f.seal(t, iam.RootTenant)

		newPriv := seedKey(9)
		ring, err := auditlog.NewKeyRing(deployment, []ed25519.PublicKey{newPriv.Public().(ed25519.PublicKey), f.pub})
		if err != nil {
			t.Fatal(err)
		}
		newKey, err := auditlog.NewSigningKey(deployment, newPriv)
		if err != nil {
			t.Fatal(err)
		}
		onlyNew := newKey.Verifier
		newKey.Verifier = ring
		f.record(t, iam.RootTenant, 6)
		if _, err := f.log.Seal(context.Background(), iam.RootTenant, newKey); err != nil {
			t.Fatalf("seal after rotation: %v", err)
		}
		rep, err := f.log.Verify(context.Background(), iam.RootTenant, ring, nil)
		if err != nil || !rep.OK() {
			t.Fatalf("verify with the ring: ok=%v err=%v findings=%v", rep.OK(), err, rep.Findings)
		}
		rep, err = f.log.Verify(context.Background(), iam.RootTenant, onlyNew, nil)
		if err != nil {
			t.Fatal(err)
		}
		var kinds []string
		for _, fd := range rep.Findings {
			kinds = append(kinds, fd.Kind)
		}
		if !slices.Contains(kinds, "checkpoint-bad-signature") {
			t.Fatalf("verify with the new key alone: findings %v", rep.Findings)
		}
	})
}

// TestParseKeyRing: `audit key` output (one key per line) parses back;
// keys of two deployments or none are refused.
func TestParseKeyRing(t *testing.T) {
	a, _ := auditlog.VerifierKey(deployment, seedKey(1).Public().(ed25519.PublicKey))
	b, _ := auditlog.VerifierKey(deployment, seedKey(2).Public().(ed25519.PublicKey))
	other, _ := auditlog.VerifierKey("other.bc.local", seedKey(3).Public().(ed25519.PublicKey))
	r, dep, err := auditlog.ParseKeyRing(a + "\n" + b + "\n\n")
	if err != nil || len(r) != 2 || dep != deployment {
		t.Fatalf("ring %d %q %v", len(r), dep, err)
	}
	if _, _, err := auditlog.ParseKeyRing(a + "\n" + other); err == nil || !strings.Contains(err.Error(), "name two deployments") {
		t.Fatalf("two deployments: %v", err)
	}
	if _, _, err := auditlog.ParseKeyRing("\n \n"); err == nil || err.Error() != "auditlog: no verifier key" {
		t.Fatalf("empty: %v", err)
	}
}
