package api_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/api"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// cacheCaller is an identity of a tenant with one binding and one key.
type cacheCaller struct {
	id, binding, keyID, key string
}

// newCacheCaller makes an identity in tenant bound to role, with a key.
func newCacheCaller(t *testing.T, e *testenv.Env, tenant, name, role string) cacheCaller {
	t.Helper()
	ctx := context.Background()
	id, err := e.Client.CreateIdentity(ctx, tenant, name, "person")
	if err != nil {
		t.Fatal(err)
	}
	var b struct{ ID string }
	if err := e.Client.Call(ctx, "bindings.create", map[string]any{"tenant_id": tenant, "identity_id": id.ID, "role_id": role}, &b); err != nil {
		t.Fatal(err)
	}
	k, err := e.Client.CreateAPIKey(ctx, tenant, id.ID, name, 0)
	if err != nil {
		t.Fatal(err)
	}
	return cacheCaller{id: id.ID, binding: b.ID, keyID: k.ID, key: k.Key}
}

// exec runs one statement on db behind the control plane's back: no
// module learns of it, so no cache is dropped.
func exec(t *testing.T, db *store.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), q, args...); err != nil {
		t.Fatal(err)
	}
}

// TestAccessCacheInEnvelope: the envelope serves a credential's
// authentication for AuthCacheTTL and an allowed read's decision for
// DecisionCacheTTL (changes made behind the control plane's back are
// seen when they expire), never caches a refusal or a mutation's
// decision, and sees a change made through the modules at once.
func TestAccessCacheInEnvelope(t *testing.T) {
	db := storetest.NewTestSQLite(t)
	clk := clock.NewFake(time.Now())
	e := testenv.Start(t, db, testenv.Options{Clock: clk})
	ctx := context.Background()
	tenant, err := e.Client.CreateTenant(ctx, "", "cached")
	if err != nil {
		t.Fatal(err)
	}
	read := func(key string) reply { return do(t, e, "POST", "/api/v1/nodes.list", key, nil, `{}`) }
	reader := newCacheCaller(t, e, tenant.ID, "reader", "viewer")

	t.Run("allowed read kept for its TTL", func(t *testing.T) {
		expectCode(t, read(reader.key), 200, "")
		exec(t, db, `DELETE FROM bindings WHERE id = $1`, reader.binding)
		expectCode(t, read(reader.key), 200, "")
		clk.Advance(api.DecisionCacheTTL)
		expectCode(t, read(reader.key), 403, "ACCESS_DENIED")
	})
	t.Run("refusal never cached", func(t *testing.T) {
		expectCode(t, read(reader.key), 403, "ACCESS_DENIED")
		exec(t, db, `INSERT INTO bindings (id, tenant_id, identity_id, role_id, created_at) VALUES ($1, $2, $3, 'viewer', 0)`, reader.binding, tenant.ID, reader.id)
		expectCode(t, read(reader.key), 200, "")
	})
	t.Run("authentication kept for its TTL", func(t *testing.T) {
		exec(t, db, `UPDATE api_keys SET revoked_at = 1 WHERE id = $1`, reader.keyID)
		expectCode(t, read(reader.key), 200, "")
		clk.Advance(api.AuthCacheTTL)
		expectCode(t, read(reader.key), 401, "UNAUTHENTICATED")
	})
	t.Run("mutation never cached", func(t *testing.T) {
		writer := newCacheCaller(t, e, tenant.ID, "writer", "admin")
		create := func(name string) reply {
			return do(t, e, "POST", "/api/v1/identities.create", writer.key, nil, `{"name":"`+name+`","kind":"person"}`)
		}
		expectCode(t, create("w1"), 200, "")
		exec(t, db, `DELETE FROM bindings WHERE id = $1`, writer.binding)
		expectCode(t, create("w2"), 403, "ACCESS_DENIED")
	})
	t.Run("changes through the modules seen at once", func(t *testing.T) {
		c := newCacheCaller(t, e, tenant.ID, "local", "admin")
		expectCode(t, read(c.key), 200, "")
		if err := e.Client.Call(ctx, "bindings.delete", map[string]any{"tenant_id": tenant.ID, "id": c.binding}, nil); err != nil {
			t.Fatal(err)
		}
		expectCode(t, read(c.key), 403, "ACCESS_DENIED")
		if err := e.Client.Bind(ctx, tenant.ID, c.id, "admin"); err != nil {
			t.Fatal(err)
		}
		expectCode(t, read(c.key), 200, "")
		if _, err := e.Client.SetTenantState(ctx, tenant.ID, "suspend"); err != nil {
			t.Fatal(err)
		}
		expectCode(t, do(t, e, "POST", "/api/v1/identities.create", c.key, nil, `{"name":"l1","kind":"person"}`), 403, "TENANT_SUSPENDED")
		if _, err := e.Client.SetTenantState(ctx, tenant.ID, "resume"); err != nil {
			t.Fatal(err)
		}
		expectCode(t, read(c.key), 200, "")
		if err := e.Client.Call(ctx, "apiKeys.revoke", map[string]any{"id": c.keyID}, nil); err != nil {
			t.Fatal(err)
		}
		expectCode(t, read(c.key), 401, "UNAUTHENTICATED")
	})
}

// TestCachedDecisionOfDeletedResource: a read's cached decision keeps the
// tenant its resource resolved to, so a resource deleted since answers
// from the method, not the resolver; the envelope turns that answer into
// exactly the one a resource that never existed gets (the one denial for
// a tenant's caller, NOT_FOUND for root), byte for byte but the request
// id.
func TestCachedDecisionOfDeletedResource(t *testing.T) {
	db := storetest.NewTestSQLite(t)
	e := testenv.Start(t, db, testenv.Options{})
	ctx := context.Background()
	tenant, err := e.Client.CreateTenant(ctx, "", "gone")
	if err != nil {
		t.Fatal(err)
	}
	admin := newCacheCaller(t, e, tenant.ID, "admin", "admin")
	get := func(key, id string) reply {
		return do(t, e, "POST", "/api/v1/nodes.get", key, nil, `{"id":"`+id+`"}`)
	}
	for _, c := range []struct {
		who, key string
		status   int
		code     string
	}{{"tenant admin", admin.key, 403, "ACCESS_DENIED"}, {"root", e.AdminKey, 404, "NOT_FOUND"}} {
		t.Run(c.who, func(t *testing.T) {
			id := "ngone" + strings.ReplaceAll(c.who, " ", "")
			exec(t, db, `INSERT INTO nodes (id, tenant_id, name, role, created_at) VALUES ($1, $2, $1, 'node', 0)`, id, tenant.ID)
			expectCode(t, get(c.key, id), 200, "")
			exec(t, db, `DELETE FROM nodes WHERE id = $1`, id)
			gone, never := get(c.key, id), get(c.key, "nnever"+id)
			expectCode(t, gone, c.status, c.code)
			if g, n := withoutRequestID(gone.body, id), withoutRequestID(never.body, "nnever"+id); g != n {
				t.Fatalf("a deleted resource answers\n%s\nand a missing one\n%s", g, n)
			}
			expectCode(t, get(c.key, id), c.status, c.code)
		})
	}
	// A method's own NOT_FOUND about a resource the resolver still finds
	// (a secret's reference resolves by its text; the secret is missing)
	// is kept with the decision cached, as on the first call.
	t.Run("the method's own NOT_FOUND kept", func(t *testing.T) {
		ref := `{"ref":"secret://` + tenant.ID + `/never-put"}`
		first := do(t, e, "POST", "/api/v1/secrets.get", admin.key, nil, ref)
		expectCode(t, first, 404, "NOT_FOUND")
		again := do(t, e, "POST", "/api/v1/secrets.get", admin.key, nil, ref)
		expectCode(t, again, 404, "NOT_FOUND")
		if withoutRequestID(first.body, "") != withoutRequestID(again.body, "") {
			t.Fatalf("first %s, then %s", first.body, again.body)
		}
	})
}

// withoutRequestID is an answer's body without its request id, and with
// the resource id it names replaced by "ID".
func withoutRequestID(body []byte, id string) string {
	var eb api.ErrorBody
	_ = json.Unmarshal(body, &eb)
	eb.Error.RequestID = ""
	if id != "" {
		eb.Error.Message = strings.ReplaceAll(eb.Error.Message, id, "ID")
	}
	b, _ := json.Marshal(eb)
	return string(b)
}
