package api_test

import (
	"context"
	"encoding/json"
	"regexp"
	"testing"

	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

var deniedRE = regexp.MustCompile(`"message":"(compute:[a-z:-]+)( on [^"]*?)? is not allowed(.*); ask an admin of tenant ([a-z0-9]+) for a role with (compute:[a-z:-]+)`)

// denialShape is a denial's answer with the action and the object the
// caller named taken out: what is left must not depend on whether the
// object exists, is another tenant's, or is denied by policy. It keeps the
// answer whole when the action named twice differs.
func (r reply) denialShape() string {
	body := r.withoutRequestID()
	m := deniedRE.FindStringSubmatch(body)
	if m == nil || m[1] != m[5] {
		return body
	}
	return deniedRE.ReplaceAllString(body, `"message":"ACTION OBJECT is not allowed$3; ask an admin of tenant $4 for a role with ACTION`)
}

func denialMessage(t *testing.T, r reply) string {
	t.Helper()
	var b struct {
		Error struct{ Code, Message string }
	}
	if err := json.Unmarshal(r.body, &b); err != nil || b.Error.Code != "ACCESS_DENIED" {
		t.Fatalf("%d %s, want ACCESS_DENIED", r.status, r.body)
	}
	return b.Error.Message
}

// ACCESS_DENIED names the action, the object the caller named and the next
// step, in words built only from the input and the caller: exact text for
// a tenant's admin, a root viewer and a scoped key.
func TestDenialSaysWhatToDo(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx := context.Background()
		tenantA, adminA := e.TenantAdmin(t, "deny-a")
		got := denialMessage(t, do(t, e, "POST", "/api/v1/nodes.get", clientKey(t, adminA), nil, `{"id":"nzzzzzzzzzzzzzzzz"}`))
		want := "compute:nodes:get on node nzzzzzzzzzzzzzzzz is not allowed: it does not exist, it is outside your tenant " + tenantA +
			", or no role of yours allows it; ask an admin of tenant " + tenantA + " for a role with compute:nodes:get"
		if got != want {
			t.Fatalf("missing node:\n got %q\nwant %q", got, want)
		}
		// The three paths to a denial (missing, another tenant's, policy)
		// give exactly the text the input alone determines.
		tenantB, _ := e.TenantAdmin(t, "deny-b")
		for id, tenant := range map[string]string{"nbbbbbbbbbbbbbbbb": tenantB, "naaaaaaaaaaaaaaaa": tenantA} {
			if _, err := db.ExecContext(ctx, `INSERT INTO nodes (id, tenant_id, name, role, created_at) VALUES ($1, $2, 'x', 'node', 0)`, id, tenant); err != nil {
				t.Fatal(err)
			}
		}
		viewerA := e.IdentityClient(t, tenantA, "deny-viewer", "viewer")
		wantRevoke := func(id string) string {
			return "compute:nodes:revoke on node " + id + " is not allowed: it does not exist, it is outside your tenant " + tenantA +
				", or no role of yours allows it; ask an admin of tenant " + tenantA + " for a role with compute:nodes:revoke"
		}
		for what, c := range map[string]struct{ key, id string }{
			"missing":          {clientKey(t, adminA), "nzzzzzzzzzzzzzzzz"},
			"another tenant's": {clientKey(t, adminA), "nbbbbbbbbbbbbbbbb"},
			"policy":           {clientKey(t, viewerA), "naaaaaaaaaaaaaaaa"},
		} {
			got := denialMessage(t, do(t, e, "POST", "/api/v1/nodes.revoke", c.key, nil, `{"node_id":"`+c.id+`"}`))
			if got != wantRevoke(c.id) {
				t.Fatalf("%s node:\n got %q\nwant %q", what, got, wantRevoke(c.id))
			}
		}
		got = denialMessage(t, do(t, e, "POST", "/api/v1/nodes.list", clientKey(t, adminA), nil, `{"tenant_id":"tzzzzzzzzzzzzzzzz"}`))
		want = "compute:nodes:list on tenant tzzzzzzzzzzzzzzzz is not allowed: it does not exist, it is outside your tenant " + tenantA +
			", or no role of yours allows it; ask an admin of tenant " + tenantA + " for a role with compute:nodes:list"
		if got != want {
			t.Fatalf("unknown tenant:\n got %q\nwant %q", got, want)
		}
		viewer := e.IdentityClient(t, iam.RootTenant, "root-viewer", "viewer")
		got = denialMessage(t, do(t, e, "POST", "/api/v1/tenants.create", clientKey(t, viewer), nil, `{"name":"x"}`))
		want = "compute:tenants:create is not allowed: no role of yours allows it; ask an admin of tenant root for a role with compute:tenants:create"
		if got != want {
			t.Fatalf("root viewer:\n got %q\nwant %q", got, want)
		}
		who, err := e.Client.CreateIdentity(ctx, "", "scoped-admin", "person")
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Client.Bind(ctx, "", who.ID, "admin"); err != nil {
			t.Fatal(err)
		}
		scoped, err := e.Client.CreateAPIKey(ctx, "", who.ID, "scoped", 0, "compute:nodes:list")
		if err != nil {
			t.Fatal(err)
		}
		got = denialMessage(t, do(t, e, "POST", "/api/v1/tenants.list", scoped.Key, nil, `{}`))
		want = "compute:tenants:list is not allowed: no role of yours (within this API key's scopes) allows it; ask an admin of tenant root for a role with compute:tenants:list, or use a key whose scopes include it"
		if got != want {
			t.Fatalf("scoped key:\n got %q\nwant %q", got, want)
		}
	})
}
