package api_test

import (
	"context"
	"testing"

	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// A binding applies in its tenant and everything below it: a parent's
// admin acts in its child and grandchild (and a caller gets its own
// tenant), while a sibling, an unknown tenant and a parent stay out of
// reach with the one ACCESS_DENIED answer.
func TestParentAdminActsInSubtree(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx := context.Background()
		tenantP, adminP := e.TenantAdmin(t, "tree-p")
		tenantS, _ := e.TenantAdmin(t, "tree-s")
		keyP := clientKey(t, adminP)
		call := func(key, method, body string) reply { return do(t, e, "POST", "/api/v1/"+method, key, nil, body) }

		// A caller gets its own tenant.
		expectCode(t, call(keyP, "tenants.get", `{"id":"`+tenantP+`"}`), 200, "")

		// The parent's admin makes a child and a grandchild and acts in both.
		child, err := adminP.CreateTenant(ctx, "", "tree-c")
		if err != nil {
			t.Fatalf("parent admin creating a child: %v", err)
		}
		grand, err := adminP.CreateTenant(ctx, child.ID, "tree-g")
		if err != nil {
			t.Fatalf("parent admin creating a grandchild: %v", err)
		}
		for _, tn := range []string{child.ID, grand.ID} {
			expectCode(t, call(keyP, "nodes.list", `{"tenant_id":"`+tn+`"}`), 200, "")
			expectCode(t, call(keyP, "identities.create", `{"tenant_id":"`+tn+`","name":"from-parent"}`), 200, "")
			expectCode(t, call(keyP, "tenants.get", `{"id":"`+tn+`"}`), 200, "")
			expectCode(t, call(keyP, "bindings.list", `{"tenant_id":"`+tn+`"}`), 200, "")
		}
		if _, err := db.ExecContext(ctx, `INSERT INTO nodes (id, tenant_id, name, role, created_at) VALUES ('ngggggggggggggggg', $1, 'g-node', 'node-tenant', 0)`, grand.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, `INSERT INTO nodes (id, tenant_id, name, role, created_at) VALUES ('nssssssssssssssss', $1, 's-node', 'node-tenant', 0)`, tenantS); err != nil {
			t.Fatal(err)
		}
		expectCode(t, call(keyP, "nodes.get", `{"id":"ngggggggggggggggg"}`), 200, "")
		expectCode(t, call(keyP, "tenants.suspend", `{"id":"`+grand.ID+`"}`), 200, "")
		expectCode(t, call(keyP, "tenants.resume", `{"id":"`+grand.ID+`"}`), 200, "")

		// A sibling, its node, an unknown tenant and a missing node answer alike.
		denied := map[string]reply{
			"sibling's nodes":      call(keyP, "nodes.list", `{"tenant_id":"`+tenantS+`"}`),
			"unknown tenant":       call(keyP, "nodes.list", `{"tenant_id":"tzzzzzzzzzzzzzzzz"}`),
			"sibling's tenant":     call(keyP, "tenants.get", `{"id":"`+tenantS+`"}`),
			"unknown tenants.get":  call(keyP, "tenants.get", `{"id":"tzzzzzzzzzzzzzzzz"}`),
			"sibling's node":       call(keyP, "nodes.get", `{"id":"nssssssssssssssss"}`),
			"missing node":         call(keyP, "nodes.get", `{"id":"nzzzzzzzzzzzzzzzz"}`),
			"suspending a sibling": call(keyP, "tenants.suspend", `{"id":"`+tenantS+`"}`),
			"suspending itself":    call(keyP, "tenants.suspend", `{"id":"`+tenantP+`"}`),
		}
		var first string
		for name, r := range denied {
			if r.status != 403 || r.code() != "ACCESS_DENIED" {
				t.Fatalf("%s: %d %s, want 403 ACCESS_DENIED", name, r.status, r.code())
			}
			if first == "" {
				first = r.denialShape()
			} else if r.denialShape() != first {
				t.Fatalf("%s answers %s, others %s", name, r.denialShape(), first)
			}
		}

		// A child's admin reaches neither its parent nor its own tenant's state.
		adminC := e.IdentityClient(t, child.ID, "c-admin", "admin")
		keyC := clientKey(t, adminC)
		expectCode(t, call(keyC, "nodes.list", `{"tenant_id":"`+tenantP+`"}`), 403, "ACCESS_DENIED")
		expectCode(t, call(keyC, "tenants.get", `{"id":"`+tenantP+`"}`), 403, "ACCESS_DENIED")
		expectCode(t, call(keyC, "tenants.suspend", `{"id":"`+child.ID+`"}`), 403, "ACCESS_DENIED")
		expectCode(t, call(keyC, "nodes.get", `{"id":"ngggggggggggggggg"}`), 200, "")

		// A suspended child is read-only for its parent too; deleted, closed.
		expectCode(t, call(keyP, "tenants.suspend", `{"id":"`+child.ID+`"}`), 200, "")
		expectCode(t, call(keyP, "nodes.list", `{"tenant_id":"`+child.ID+`"}`), 200, "")
		expectCode(t, call(keyP, "identities.create", `{"tenant_id":"`+grand.ID+`","name":"late"}`), 403, "TENANT_SUSPENDED")
		expectCode(t, call(keyP, "tenants.delete", `{"id":"`+child.ID+`"}`), 200, "")
		expectCode(t, call(keyP, "nodes.list", `{"tenant_id":"`+child.ID+`"}`), 403, "TENANT_SUSPENDED")
	})
}
