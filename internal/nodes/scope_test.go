package nodes

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/quota"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// TestScopeAndTenantsOf: List, Labeled and Get show a tenant's scope only its own
// nodes and the root scope every node; the zero scope sees none.
// TenantsOf answers every known node's tenant in one call and leaves
// unknown ids out.
func TestScopeAndTenantsOf(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		clk := clock.NewFake(time.UnixMilli(1_700_000_000_000))
		tenant, err := iam.New(db, clk).CreateTenant(ctx, audit.Entry{TenantID: iam.RootTenant, Actor: "test"}, iam.RootTenant, "acme")
		if err != nil {
			t.Fatal(err)
		}
		s := New(db, clk, audit.NewEvents(db, clk, iam.RootTenant), bus.New(), slog.New(slog.DiscardHandler), quota.New(db, clk, quota.Defaults()), Config{})
		for id, owner := range map[string]string{"n-root": iam.RootTenant, "n-acme": tenant.ID} {
			if _, err := db.ExecContext(ctx, sqlInsertNode, id, owner, id, "node", clk.Now().UnixMilli()); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := db.ExecContext(ctx, `UPDATE nodes SET labels = $1 WHERE id = $2`, `{"fleet":"a"}`, "n-acme"); err != nil {
			t.Fatal(err)
		}
		// Labeled fills what a fan-out by labels selects on.
		if ns, err := s.Labeled(ctx, iam.ScopeOf(tenant.ID)); err != nil || len(ns) != 1 || ns[0].TenantID != tenant.ID || ns[0].Labels["fleet"] != "a" {
			t.Errorf("Labeled: %+v %v, want n-acme of %s labelled fleet=a", ns, err, tenant.ID)
		}
		// List and Labeled (what a fan-out by labels selects from) keep
		// to the same scope.
		for name, list := range map[string]func(context.Context, iam.Scope) ([]Node, error){"List": s.List, "Labeled": s.Labeled} {
			names := func(scope iam.Scope) []string {
				ns, err := list(ctx, scope)
				if err != nil {
					t.Fatal(err)
				}
				var out []string
				for _, n := range ns {
					out = append(out, n.ID)
				}
				return out
			}
			if got := names(iam.RootScope()); len(got) != 2 {
				t.Errorf("%s: root scope lists %v", name, got)
			}
			if got := names(iam.ScopeOf(tenant.ID)); len(got) != 1 || got[0] != "n-acme" {
				t.Errorf("%s: tenant scope lists %v", name, got)
			}
			if got := names(iam.Scope{}); len(got) != 0 {
				t.Errorf("%s: zero scope lists %v", name, got)
			}
		}
		if _, err := s.Get(ctx, iam.ScopeOf(tenant.ID), "n-root"); errs.CodeOf(err) != errs.NotFound {
			t.Errorf("another tenant's node: %v", err)
		}
		if n, err := s.Get(ctx, iam.RootScope(), "n-acme"); err != nil || n.TenantID != tenant.ID {
			t.Errorf("root scope get: %+v %v", n, err)
		}
		got, err := s.TenantsOf(ctx, []string{"n-root", "n-acme", "n-unknown"})
		if err != nil || len(got) != 2 || got["n-root"] != iam.RootTenant || got["n-acme"] != tenant.ID {
			t.Errorf("TenantsOf: %v %v", got, err)
		}
	})
}
