package api_test

import (
	"context"
	"errors"
	"testing"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// denyAllRole makes a role in tenant that denies everything.
func denyAllRole(t *testing.T, c *client.Client, tenant string) string {
	t.Helper()
	var role struct{ ID string }
	if err := c.Call(context.Background(), "roles.create", map[string]any{"tenant_id": tenant, "name": "deny-all", "statements": []map[string]any{
		{"effect": "deny", "actions": []string{"*"}, "resources": []string{"*"}},
	}}, &role); err != nil {
		t.Fatal(err)
	}
	return role.ID
}

// A tenant admin cannot lock root out: a binding may name only identities
// of its own tenant or a tenant below it, and any other identity (root's
// admin, a sibling's) is refused exactly as one that does not exist. A
// binding of an ancestor's identity that is in the database anyway never
// applies, and root finds every binding with bindings.list.
func TestBindingsNameOnlySubtreeIdentities(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx := context.Background()
		tenantT, adminT := e.TenantAdmin(t, "bind-t")
		tenantS, _ := e.TenantAdmin(t, "bind-s")
		sibling, err := e.Client.CreateIdentity(ctx, tenantS, "sib", "person")
		if err != nil {
			t.Fatal(err)
		}
		deny := denyAllRole(t, adminT, tenantT)

		bind := func(identity string) error {
			return adminT.Call(ctx, "bindings.create", map[string]any{"tenant_id": tenantT, "identity_id": identity, "role_id": deny}, nil)
		}
		var missing *client.Error
		if err := bind("iqqqqqqqqqqqqqqqq"); !errors.As(err, &missing) || missing.Code != "INVALID_INPUT" {
			t.Fatalf("binding a missing identity: %v, want INVALID_INPUT", err)
		}
		for name, id := range map[string]string{"root's admin": "admin", "a sibling's identity": sibling.ID} {
			var got *client.Error
			if err := bind(id); !errors.As(err, &got) || got.Status != missing.Status || got.Code != missing.Code || got.Message != missing.Message {
				t.Fatalf("binding %s: %v, want %d %s %q as for a missing identity", name, err, missing.Status, missing.Code, missing.Message)
			}
		}
		// Root still acts in T.
		if err := e.Client.Call(ctx, "nodes.list", map[string]any{"tenant_id": tenantT}, nil); err != nil {
			t.Fatalf("root in T after the refused binding: %v", err)
		}
		// An identity of a tenant below T may be bound in T.
		child, err := e.Client.CreateTenant(ctx, tenantT, "bind-c")
		if err != nil {
			t.Fatal(err)
		}
		low, err := e.Client.CreateIdentity(ctx, child.ID, "low", "person")
		if err != nil {
			t.Fatal(err)
		}
		if err := bind(low.ID); err != nil {
			t.Fatalf("binding an identity of T's child in T: %v", err)
		}

		// A lockout binding written around the rule (as an older release
		// allowed) does not apply, and root finds it.
		if _, err := db.ExecContext(ctx, `INSERT INTO bindings (id, tenant_id, identity_id, role_id, created_at) VALUES ('blockout', $1, 'admin', $2, 0)`, tenantT, deny); err != nil {
			t.Fatal(err)
		}
		if err := e.Client.Call(ctx, "nodes.list", map[string]any{"tenant_id": tenantT}, nil); err != nil {
			t.Fatalf("root in T with a stored lockout binding: %v", err)
		}
		bs, err := e.Client.Bindings(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		found := map[string]client.Binding{}
		for _, b := range bs {
			found[b.ID] = b
		}
		if b := found["blockout"]; b.TenantID != tenantT || b.IdentityID != "admin" || b.IdentityTenantID != "root" || b.RoleName != "deny-all" {
			t.Fatalf("root's bindings.list shows the lockout binding as %+v (all: %+v)", b, bs)
		}
		if _, ok := found["admin"]; !ok {
			t.Fatalf("root's bindings.list lacks root's own binding: %+v", bs)
		}
		// T's admin lists T's subtree only, and may not list a sibling's.
		tbs, err := adminT.Bindings(ctx, tenantT)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range tbs {
			if b.TenantID != tenantT && b.TenantID != child.ID {
				t.Fatalf("T's admin sees a binding of %s: %+v", b.TenantID, b)
			}
		}
		if len(tbs) != 3 { // T's admin, low in T, the stored lockout binding
			t.Fatalf("T's bindings: %+v", tbs)
		}
		if _, err := adminT.Bindings(ctx, tenantS); !errors.Is(err, client.ErrAccessDenied) {
			t.Fatalf("T's admin listing S's bindings: %v, want ACCESS_DENIED", err)
		}
		// Root removes the lockout binding.
		if err := e.Client.Call(ctx, "bindings.delete", map[string]any{"tenant_id": tenantT, "id": "blockout"}, nil); err != nil {
			t.Fatal(err)
		}
	})
}
