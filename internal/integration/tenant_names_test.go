package integration

import (
	"context"
	"testing"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// A tenant's name is unique among its live siblings (migration 0029): a
// second one of the same name under the same parent is refused CONFLICT;
// the same name under another parent, or again once the first is deleted,
// is fine.
func TestTenantNamesUniqueAmongSiblings(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx := context.Background()
		a, err := e.Client.CreateTenant(ctx, "", "acme")
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.Client.CreateTenant(ctx, "", "acme")
		if client.CodeOf(err) != "CONFLICT" {
			t.Fatalf("second acme under root: %v, want CONFLICT", err)
		}
		if _, err := e.Client.CreateTenant(ctx, a.ID, "acme"); err != nil {
			t.Fatalf("acme under acme: %v", err)
		}
		if _, err := e.Client.SetTenantState(ctx, a.ID, "delete"); err != nil {
			t.Fatal(err)
		}
		if _, err := e.Client.CreateTenant(ctx, "", "acme"); err != nil {
			t.Fatalf("acme again after the first was deleted: %v", err)
		}
	})
}
