package iam_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// Tenants nest at most 32 levels below the root tenant, the depth the
// tenant chain and the subtree walk reach: a deeper tenant would see
// neither a deleted ancestor's state nor its teardown, so its keys would
// outlive the deletion. The 33rd level is refused (INVALID_INPUT), and
// the deepest allowed tenant still sees the root tenant in its chain and
// is in root's subtree.
func TestTenantsNestAtMost32Deep(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		s := iam.New(db, clock.NewFake(time.Unix(1_700_000_000, 0)))
		actor := audit.Entry{TenantID: iam.RootTenant, Actor: "test"}
		parent := iam.RootTenant
		for level := 1; level <= 32; level++ {
			tn, err := s.CreateTenant(ctx, actor, parent, fmt.Sprintf("l%d", level))
			if err != nil {
				t.Fatalf("level %d: %v", level, err)
			}
			parent = tn.ID
		}
		_, err := s.CreateTenant(ctx, actor, parent, "l33")
		if errs.CodeOf(err) != errs.InvalidInput {
			t.Fatalf("level 33: %v, want INVALID_INPUT", err)
		}
		chain, err := s.Chain(ctx, parent)
		if err != nil || len(chain) != 33 || chain[32].ID != iam.RootTenant {
			t.Fatalf("chain of the deepest tenant: %d tenants (%v), want 33 ending at root", len(chain), err)
		}
		tree, err := s.ListTenants(ctx, iam.RootTenant)
		if err != nil || tree[len(tree)-1].ID != parent {
			t.Fatalf("root's subtree does not reach the deepest tenant (%v)", err)
		}
	})
}
