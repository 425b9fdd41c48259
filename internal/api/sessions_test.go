package api_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/api"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/server"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

const sessionOrigin = "https://bc.example:8443"

// sessionEnv is a control plane with session cookies on and a fake clock.
func sessionEnv(t *testing.T, db *store.DB) (*testenv.Env, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(time.Now().Truncate(time.Second))
	e := testenv.Start(t, db, testenv.Options{Clock: clk, Tune: func(o *server.Options) {
		o.SessionCookies, o.BaseURL = true, sessionOrigin+"/ui"
	}})
	return e, clk
}

// asSession calls method with the session cookie value.
func asSession(t *testing.T, e *testenv.Env, value, method, body string) reply {
	t.Helper()
	return do(t, e, "POST", "/api/v1/"+method, "", map[string]string{"Cookie": "bc_session=" + value, "Origin": sessionOrigin}, body)
}

type madeSession struct {
	ID        string    `json:"id"`
	Value     string    `json:"value"`
	ExpiresAt time.Time `json:"expires_at"`
}

type madeKey struct {
	ID        string     `json:"id"`
	Key       string     `json:"key"`
	ExpiresAt *time.Time `json:"expires_at"`
}

func decodeOK[T any](t *testing.T, r reply) T {
	t.Helper()
	expectCode(t, r, 200, "")
	var v T
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("%v: %s", err, r.body)
	}
	return v
}

// A session never outlives what made it: its expiry is at most its key's
// (or its maker session's); revoking the key, the maker session or the
// session itself ends it; a session or an expiring key cannot make a key
// or a session that outlives it, while a key without expiry may make any;
// a session has its key's scopes.
func TestSessionsNeverOutliveTheirMaker(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e, clk := sessionEnv(t, db)
		ctx := context.Background()
		key := func(t *testing.T, name string, ttl time.Duration, scopes ...string) client.APIKey {
			t.Helper()
			k, err := e.Client.CreateAPIKey(ctx, "root", "admin", name, ttl, scopes...)
			if err != nil {
				t.Fatal(err)
			}
			return k
		}
		sessionOf := func(t *testing.T, k string) madeSession {
			t.Helper()
			return decodeOK[madeSession](t, do(t, e, "POST", "/api/v1/sessions.create", k, nil, `{}`))
		}

		t.Run("expiry capped at the key's", func(t *testing.T) {
			short := key(t, "short", time.Minute)
			s := sessionOf(t, short.Key)
			if want := clk.Now().Add(time.Minute); !s.ExpiresAt.Equal(want) {
				t.Fatalf("session of a 60 s key expires at %v, want %v", s.ExpiresAt, want)
			}
			expectCode(t, asSession(t, e, s.Value, "nodes.list", `{}`), 200, "")
			clk.Advance(time.Minute)
			expectCode(t, asSession(t, e, s.Value, "nodes.list", `{}`), 401, "UNAUTHENTICATED")
			// A key without expiry makes a 12 h session.
			long := sessionOf(t, key(t, "long", 0).Key)
			if want := clk.Now().Add(12 * time.Hour); !long.ExpiresAt.Equal(want) {
				t.Fatalf("session of a key without expiry expires at %v, want %v", long.ExpiresAt, want)
			}
		})

		t.Run("revoked with its key", func(t *testing.T) {
			k := key(t, "rev", 0)
			s := sessionOf(t, k.Key)
			expectCode(t, asSession(t, e, s.Value, "nodes.list", `{}`), 200, "")
			if err := e.Client.Call(ctx, "apiKeys.revoke", map[string]any{"id": k.ID}, nil); err != nil {
				t.Fatal(err)
			}
			expectCode(t, asSession(t, e, s.Value, "nodes.list", `{}`), 401, "UNAUTHENTICATED")
		})

		t.Run("sessions.revoke", func(t *testing.T) {
			s := sessionOf(t, key(t, "sr", 0).Key)
			below := decodeOK[madeSession](t, asSession(t, e, s.Value, "sessions.create", `{}`))
			expectCode(t, asSession(t, e, below.Value, "nodes.list", `{}`), 200, "")
			if err := e.Client.RevokeSession(ctx, "", s.ID); err != nil {
				t.Fatal(err)
			}
			expectCode(t, asSession(t, e, s.Value, "nodes.list", `{}`), 401, "UNAUTHENTICATED")
			expectCode(t, asSession(t, e, below.Value, "nodes.list", `{}`), 401, "UNAUTHENTICATED")
			if err := e.Client.RevokeSession(ctx, "", s.ID); client.CodeOf(err) != "NOT_FOUND" {
				t.Fatalf("revoking a revoked session: %v, want NOT_FOUND", err)
			}
			// A session signs itself out with no id.
			self := sessionOf(t, key(t, "self", 0).Key)
			expectCode(t, asSession(t, e, self.Value, "sessions.revoke", `{}`), 200, "")
			expectCode(t, asSession(t, e, self.Value, "nodes.list", `{}`), 401, "UNAUTHENTICATED")
			// Another tenant's admin cannot revoke root's session.
			_, adminA := e.TenantAdmin(t, "sess-a")
			other := sessionOf(t, key(t, "other", 0).Key)
			if err := adminA.RevokeSession(ctx, "", other.ID); client.CodeOf(err) != "NOT_FOUND" {
				t.Fatalf("tenant A revoking root's session: %v, want NOT_FOUND", err)
			}
			expectCode(t, asSession(t, e, other.Value, "nodes.list", `{}`), 200, "")
		})

		t.Run("makes nothing that outlives it", func(t *testing.T) {
			short := key(t, "maker", time.Minute)
			limit := clk.Now().Add(time.Minute)
			s := sessionOf(t, short.Key)
			// A session making a key without expiry gets one that ends with it.
			fromSession := decodeOK[madeKey](t, asSession(t, e, s.Value, "apiKeys.create", `{"tenant_id":"root","identity_id":"admin","name":"k2","ttl_seconds":0}`))
			if fromSession.ExpiresAt == nil || !fromSession.ExpiresAt.Equal(limit) {
				t.Fatalf("key made by a session expires at %v, want %v", fromSession.ExpiresAt, limit)
			}
			// A 60 s key asking for a day gets its own minute.
			fromKey := decodeOK[madeKey](t, do(t, e, "POST", "/api/v1/apiKeys.create", short.Key, nil, `{"tenant_id":"root","identity_id":"admin","name":"k3","ttl_seconds":86400}`))
			if fromKey.ExpiresAt == nil || !fromKey.ExpiresAt.Equal(limit) {
				t.Fatalf("key made by a 60 s key expires at %v, want %v", fromKey.ExpiresAt, limit)
			}
			again := decodeOK[madeSession](t, asSession(t, e, s.Value, "sessions.create", `{}`))
			if !again.ExpiresAt.Equal(limit) {
				t.Fatalf("session made by a session expires at %v, want %v", again.ExpiresAt, limit)
			}
			clk.Advance(time.Minute)
			for name, r := range map[string]reply{
				"key made by the session": do(t, e, "POST", "/api/v1/nodes.list", fromSession.Key, nil, `{}`),
				"key made by the key":     do(t, e, "POST", "/api/v1/nodes.list", fromKey.Key, nil, `{}`),
				"session made by session": asSession(t, e, again.Value, "nodes.list", `{}`),
			} {
				if r.status != 401 || r.code() != "UNAUTHENTICATED" {
					t.Fatalf("%s after its maker expired: %d %s", name, r.status, r.code())
				}
			}
			// A key without expiry may make any.
			forever := decodeOK[madeKey](t, do(t, e, "POST", "/api/v1/apiKeys.create", e.AdminKey, nil, `{"tenant_id":"root","identity_id":"admin","name":"k4","ttl_seconds":0}`))
			if forever.ExpiresAt != nil {
				t.Fatalf("key made by a key without expiry expires at %v", forever.ExpiresAt)
			}
		})

		t.Run("scopes follow", func(t *testing.T) {
			scoped := key(t, "scoped", 0, "compute:nodes:list", "compute:sessions:create", "compute:api-keys:create")
			s := sessionOf(t, scoped.Key)
			expectCode(t, asSession(t, e, s.Value, "nodes.list", `{}`), 200, "")
			expectCode(t, asSession(t, e, s.Value, "tenants.create", `{"name":"nope"}`), 403, "ACCESS_DENIED")
			// A scoped key makes only keys within its scopes.
			expectCode(t, do(t, e, "POST", "/api/v1/apiKeys.create", scoped.Key, nil, `{"tenant_id":"root","identity_id":"admin","name":"wide","scopes":["*"]}`), 400, "INVALID_INPUT")
			inherit := decodeOK[madeKey](t, do(t, e, "POST", "/api/v1/apiKeys.create", scoped.Key, nil, `{"tenant_id":"root","identity_id":"admin","name":"narrow"}`))
			expectCode(t, do(t, e, "POST", "/api/v1/tenants.create", inherit.Key, nil, `{"name":"nope"}`), 403, "ACCESS_DENIED")
		})

		t.Run("ends with its identity", func(t *testing.T) {
			tenant, _ := e.TenantAdmin(t, "sess-gone")
			id, err := e.Client.CreateIdentity(ctx, tenant, "leaver", "person")
			if err != nil {
				t.Fatal(err)
			}
			if err := e.Client.Bind(ctx, tenant, id.ID, "admin"); err != nil {
				t.Fatal(err)
			}
			k, err := e.Client.CreateAPIKey(ctx, tenant, id.ID, "leaver", 0)
			if err != nil {
				t.Fatal(err)
			}
			s := sessionOf(t, k.Key)
			expectCode(t, asSession(t, e, s.Value, "nodes.list", `{}`), 200, "")
			// An identity cannot delete itself; a wrong tenant is NOT_FOUND.
			expectCode(t, asSession(t, e, s.Value, "identities.delete", `{"tenant_id":"`+tenant+`","id":"`+id.ID+`"}`), 409, "INVALID_STATE")
			expectCode(t, do(t, e, "POST", "/api/v1/identities.delete", e.AdminKey, nil, `{"tenant_id":"root","id":"`+id.ID+`"}`), 404, "NOT_FOUND")
			expectCode(t, do(t, e, "POST", "/api/v1/identities.delete", e.AdminKey, nil, `{"tenant_id":"`+tenant+`","id":"`+id.ID+`"}`), 200, "")
			expectCode(t, asSession(t, e, s.Value, "nodes.list", `{}`), 401, "UNAUTHENTICATED")
			expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", k.Key, nil, `{}`), 401, "UNAUTHENTICATED")
			// A credential whose identity row is gone, however it went,
			// does not authenticate either.
			k2 := key(t, "orphan", 0)
			s2 := sessionOf(t, k2.Key)
			if _, err := db.ExecContext(ctx, `UPDATE api_keys SET identity = 'igone' WHERE id = $1`, k2.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, `UPDATE sessions SET identity_id = 'igone' WHERE id = $1`, s2.ID); err != nil {
				t.Fatal(err)
			}
			// Written behind the modules' back (no access poke): seen once
			// the cached authentication expires.
			clk.Advance(api.AuthCacheTTL)
			expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", k2.Key, nil, `{}`), 401, "UNAUTHENTICATED")
			expectCode(t, asSession(t, e, s2.Value, "nodes.list", `{}`), 401, "UNAUTHENTICATED")
			// Nor one whose identity exists, but in another tenant than
			// the credential's.
			other, err := e.Client.CreateIdentity(ctx, tenant, "elsewhere", "person")
			if err != nil {
				t.Fatal(err)
			}
			k3 := key(t, "moved", 0)
			s3 := sessionOf(t, k3.Key)
			if _, err := db.ExecContext(ctx, `UPDATE api_keys SET identity = $1 WHERE id = $2`, other.ID, k3.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, `UPDATE sessions SET identity_id = $1 WHERE id = $2`, other.ID, s3.ID); err != nil {
				t.Fatal(err)
			}
			clk.Advance(api.AuthCacheTTL)
			expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", k3.Key, nil, `{}`), 401, "UNAUTHENTICATED")
			expectCode(t, asSession(t, e, s3.Value, "nodes.list", `{}`), 401, "UNAUTHENTICATED")
		})
	})
}
