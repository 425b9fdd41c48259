package api_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// madeIdentity makes an identity of tenant bound to role (none when "")
// with a key root made for it, and returns its id and key.
func madeIdentity(t *testing.T, e *testenv.Env, tenant, name, role string) (id, key string) {
	t.Helper()
	ctx := context.Background()
	i, err := e.Client.CreateIdentity(ctx, tenant, name, "person")
	if err != nil {
		t.Fatal(err)
	}
	if role != "" {
		if err := e.Client.Bind(ctx, tenant, i.ID, role); err != nil {
			t.Fatal(err)
		}
	}
	k, err := e.Client.CreateAPIKey(ctx, tenant, i.ID, name, 0)
	if err != nil {
		t.Fatal(err)
	}
	return i.ID, k.Key
}

func keyBody(tenant, identity, name string, scopes ...string) string {
	b := fmt.Sprintf(`{"tenant_id":%q,"identity_id":%q,"name":%q`, tenant, identity, name)
	if len(scopes) > 0 {
		b += `,"scopes":[`
		for i, s := range scopes {
			if i > 0 {
				b += ","
			}
			b += fmt.Sprintf("%q", s)
		}
		b += "]"
	}
	return b + "}"
}

// A caller whose only permission is compute:api-keys:create makes keys
// for itself, never for another identity of its tenant (its admin
// included): that needs compute:api-keys:create-for-others on the
// identity, which the built-in admin role has and operator and viewer do
// not, and which a role may grant for one identity only. A scoped key
// makes no key beyond its scopes, for itself or another.
func TestKeysForOtherIdentities(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx := context.Background()
		tenant, _ := e.TenantAdmin(t, "keys")
		adminID, adminKey := madeIdentity(t, e, tenant, "boss", "admin")
		var role, narrow struct{ ID string }
		if err := e.Client.Call(ctx, "roles.create", map[string]any{"tenant_id": tenant, "name": "key-minter", "statements": []map[string]any{
			{"effect": "allow", "actions": []string{"compute:api-keys:create"}, "resources": []string{"*"}},
		}}, &role); err != nil {
			t.Fatal(err)
		}
		minterID, minterKey := madeIdentity(t, e, tenant, "minter", role.ID)
		botID, _ := madeIdentity(t, e, tenant, "bot", "")

		// For another identity: ACCESS_DENIED, as a call it may not make.
		expectCode(t, do(t, e, "POST", "/api/v1/apiKeys.create", minterKey, nil, keyBody(tenant, adminID, "takeover")), 403, "ACCESS_DENIED")
		expectCode(t, do(t, e, "POST", "/api/v1/apiKeys.create", minterKey, nil, keyBody(tenant, botID, "bot")), 403, "ACCESS_DENIED")
		// An identity that does not exist answers the same.
		expectCode(t, do(t, e, "POST", "/api/v1/apiKeys.create", minterKey, nil, keyBody(tenant, "i_nobody", "x")), 403, "ACCESS_DENIED")
		// For itself: allowed, and the key works.
		own := decodeOK[madeKey](t, do(t, e, "POST", "/api/v1/apiKeys.create", minterKey, nil, keyBody(tenant, minterID, "own")))
		expectCode(t, do(t, e, "POST", "/api/v1/apiKeys.create", own.Key, nil, keyBody(tenant, minterID, "own2")), 200, "")
		// The operator and viewer roles make no key for anyone else.
		for _, r := range []string{"operator", "viewer"} {
			_, k := madeIdentity(t, e, tenant, r+"-x", r)
			expectCode(t, do(t, e, "POST", "/api/v1/apiKeys.create", k, nil, keyBody(tenant, adminID, r)), 403, "ACCESS_DENIED")
		}
		// The admin role makes keys for others.
		expectCode(t, do(t, e, "POST", "/api/v1/apiKeys.create", adminKey, nil, keyBody(tenant, botID, "for-bot")), 200, "")
		// A role may allow it for one identity only.
		if err := e.Client.Call(ctx, "roles.create", map[string]any{"tenant_id": tenant, "name": "bot-keys", "statements": []map[string]any{
			{"effect": "allow", "actions": []string{"compute:api-keys:create"}, "resources": []string{"*"}},
			{"effect": "allow", "actions": []string{"compute:api-keys:create-for-others"}, "resources": []string{"identity/" + botID}},
		}}, &narrow); err != nil {
			t.Fatal(err)
		}
		_, botKeeper := madeIdentity(t, e, tenant, "bot-keeper", narrow.ID)
		expectCode(t, do(t, e, "POST", "/api/v1/apiKeys.create", botKeeper, nil, keyBody(tenant, botID, "bot2")), 200, "")
		expectCode(t, do(t, e, "POST", "/api/v1/apiKeys.create", botKeeper, nil, keyBody(tenant, adminID, "boss2")), 403, "ACCESS_DENIED")

		// Scopes: the admin's key scoped to api-keys:create makes no key for
		// another identity (the further action is outside its scopes) and
		// none with more scopes than it has.
		scoped := decodeOK[madeKey](t, do(t, e, "POST", "/api/v1/apiKeys.create", adminKey, nil, keyBody(tenant, adminID, "scoped", "compute:api-keys:create", "compute:nodes:list")))
		expectCode(t, do(t, e, "POST", "/api/v1/apiKeys.create", scoped.Key, nil, keyBody(tenant, botID, "via-scoped")), 403, "ACCESS_DENIED")
		expectCode(t, do(t, e, "POST", "/api/v1/apiKeys.create", scoped.Key, nil, keyBody(tenant, adminID, "wider", "*")), 400, "INVALID_INPUT")
		sub := decodeOK[madeKey](t, do(t, e, "POST", "/api/v1/apiKeys.create", scoped.Key, nil, keyBody(tenant, adminID, "same")))
		// The key it made has its scopes: no more than them.
		expectCode(t, do(t, e, "POST", "/api/v1/identities.list", sub.Key, nil, fmt.Sprintf(`{"tenant_id":%q}`, tenant)), 403, "ACCESS_DENIED")
		expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", sub.Key, nil, fmt.Sprintf(`{"tenant_id":%q}`, tenant)), 200, "")
	})
}

// A key made by a session or a key is revoked with its maker, at any
// depth: sessions.revoke of the session that made a key, apiKeys.revoke of
// the key that made a key (or made the session that made one), and
// identities.delete of the identity whose key made a key for another
// identity; every key made below answers 401.
func TestKeysDieWithTheirMaker(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e, _ := sessionEnv(t, db)
		ctx := context.Background()
		rootKey := func(t *testing.T, name string) madeKey {
			t.Helper()
			k, err := e.Client.CreateAPIKey(ctx, "root", "admin", name, 0)
			if err != nil {
				t.Fatal(err)
			}
			return madeKey{ID: k.ID, Key: k.Key}
		}
		works := func(t *testing.T, key string, status int, code string) {
			t.Helper()
			expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", key, nil, `{}`), status, code)
		}
		mint := func(t *testing.T, key, name string) madeKey {
			t.Helper()
			return decodeOK[madeKey](t, do(t, e, "POST", "/api/v1/apiKeys.create", key, nil, keyBody("root", "admin", name)))
		}

		t.Run("session revoked", func(t *testing.T) {
			k := rootKey(t, "s-maker")
			s := decodeOK[madeSession](t, do(t, e, "POST", "/api/v1/sessions.create", k.Key, nil, `{}`))
			made := decodeOK[madeKey](t, asSession(t, e, s.Value, "apiKeys.create", keyBody("root", "admin", "from-session")))
			below := mint(t, made.Key, "below-session-key")
			works(t, made.Key, 200, "")
			if err := e.Client.RevokeSession(ctx, "", s.ID); err != nil {
				t.Fatal(err)
			}
			works(t, made.Key, 401, "UNAUTHENTICATED")
			works(t, below.Key, 401, "UNAUTHENTICATED")
			works(t, k.Key, 200, "")
		})

		t.Run("key revoked", func(t *testing.T) {
			first := rootKey(t, "k-maker")
			second := mint(t, first.Key, "second")
			third := mint(t, second.Key, "third")
			// first → session → key, too.
			s := decodeOK[madeSession](t, do(t, e, "POST", "/api/v1/sessions.create", first.Key, nil, `{}`))
			viaSession := decodeOK[madeKey](t, asSession(t, e, s.Value, "apiKeys.create", keyBody("root", "admin", "via-session")))
			works(t, third.Key, 200, "")
			works(t, viaSession.Key, 200, "")
			if err := e.Client.Call(ctx, "apiKeys.revoke", map[string]any{"id": first.ID}, nil); err != nil {
				t.Fatal(err)
			}
			for _, k := range []madeKey{first, second, third, viaSession} {
				works(t, k.Key, 401, "UNAUTHENTICATED")
			}
			// Revoking a key in the middle leaves the one above it.
			top := rootKey(t, "top")
			mid := mint(t, top.Key, "mid")
			low := mint(t, mid.Key, "low")
			if err := e.Client.Call(ctx, "apiKeys.revoke", map[string]any{"id": mid.ID}, nil); err != nil {
				t.Fatal(err)
			}
			works(t, low.Key, 401, "UNAUTHENTICATED")
			works(t, top.Key, 200, "")
		})

		t.Run("identity deleted", func(t *testing.T) {
			tenant, _ := e.TenantAdmin(t, "gone")
			_, leaverKey := madeIdentity(t, e, tenant, "leaver", "admin")
			stayID, _ := madeIdentity(t, e, tenant, "stayer", "admin")
			forOther := decodeOK[madeKey](t, do(t, e, "POST", "/api/v1/apiKeys.create", leaverKey, nil, keyBody(tenant, stayID, "made-by-leaver")))
			expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", forOther.Key, nil, `{}`), 200, "")
			var ids struct {
				Identities []struct{ ID, Name string }
			}
			if err := e.Client.Call(ctx, "identities.list", map[string]any{"tenant_id": tenant}, &ids); err != nil {
				t.Fatal(err)
			}
			for _, i := range ids.Identities {
				if i.Name == "leaver" {
					if err := e.Client.Call(ctx, "identities.delete", map[string]any{"tenant_id": tenant, "id": i.ID}, nil); err != nil {
						t.Fatal(err)
					}
				}
			}
			expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", leaverKey, nil, `{}`), 401, "UNAUTHENTICATED")
			expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", forOther.Key, nil, `{}`), 401, "UNAUTHENTICATED")
		})
	})
}
