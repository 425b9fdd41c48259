package integration

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/api"
	"github.com/bettercompute/bettercompute/internal/server"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// startSecondAPI starts a second control plane process with only the api
// role on e's database: it shares nothing in memory with the first (its
// own bus, its own access cache), so what it learns of a change made
// through the first comes over PostgreSQL NOTIFY.
func startSecondAPI(t *testing.T, e *testenv.Env) *server.ControlPlane {
	t.Helper()
	o := server.Options{DB: e.CP.DB, Bundle: e.Bundle, KEK: e.KEK, Clock: e.Clock, Log: e.Log, Roles: []string{server.RoleAPI},
		APIListen: "127.0.0.1:0", APIPlainHTTP: true, RevocationPoll: 200 * time.Millisecond,
		RateLimits: api.RateLimits{ReadPerSecond: 1e6, ReadBurst: 1e6, MutatePerSecond: 1e6, MutateBurst: 1e6}}
	cp, err := server.Start(context.Background(), o)
	if err != nil {
		t.Fatalf("start second api: %v", err)
	}
	t.Cleanup(cp.Close)
	return cp
}

// cacheIdentity is an identity with one binding and a key, and its
// clients on the first and the second process.
type cacheIdentity struct {
	id, binding, keyID string
	onB                *client.Client
}

func newCacheIdentity(t *testing.T, e *testenv.Env, b *server.ControlPlane, tenant, name, role string) cacheIdentity {
	t.Helper()
	ctx := context.Background()
	id, err := e.Client.CreateIdentity(ctx, tenant, name, "person")
	if err != nil {
		t.Fatal(err)
	}
	var bind struct{ ID string }
	if err := e.Client.Call(ctx, "bindings.create", map[string]any{"tenant_id": tenant, "identity_id": id.ID, "role_id": role}, &bind); err != nil {
		t.Fatal(err)
	}
	k, err := e.Client.CreateAPIKey(ctx, tenant, id.ID, name, 0)
	if err != nil {
		t.Fatal(err)
	}
	return cacheIdentity{id: id.ID, binding: bind.ID, keyID: k.ID, onB: client.New("http://"+b.APIAddr, k.Key)}
}

// warm makes two allowed reads on the second process, so its access
// cache holds the key's authentication and the read's decision.
func (c cacheIdentity) warm(t *testing.T) {
	t.Helper()
	for range 2 {
		if _, err := c.onB.Nodes(context.Background()); err != nil {
			t.Fatalf("warm-up read on the second process: %v", err)
		}
	}
}

// refusedWithin waits until call is refused with want, failing the test
// when it is not within d.
func refusedWithin(t *testing.T, d time.Duration, want *client.Error, call func() error) {
	t.Helper()
	start := time.Now()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		err := call()
		if errors.Is(err, want) {
			t.Logf("refused %s after %v", want.Code, time.Since(start).Round(time.Millisecond))
			return
		}
		if err != nil {
			t.Fatalf("got %v, want %s", err, want.Code)
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("still allowed %v after the change, want %s within %v", d, want.Code, d)
		}
	}
}

// waitCacheServes waits until the second process serves a read from its
// access cache (its poke listener live): a binding removed behind the
// control plane's back (no poke) is not seen while the decision is cached.
func waitCacheServes(t *testing.T, db *store.DB, c cacheIdentity) {
	t.Helper()
	ctx := context.Background()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		c.warm(t)
		if _, err := db.ExecContext(ctx, `DELETE FROM bindings WHERE id = $1`, c.binding); err != nil {
			t.Fatal(err)
		}
		_, err := c.onB.Nodes(ctx)
		if _, err := db.ExecContext(ctx, `INSERT INTO bindings (id, tenant_id, identity_id, role_id, created_at) SELECT $1, tenant_id, id, 'viewer', 0 FROM identities WHERE id = $2`, c.binding, c.id); err != nil {
			t.Fatal(err)
		}
		if err == nil {
			return
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatal("the second process never served from its access cache")
		}
	}
}

// TestAccessCacheRevocationAcrossProcesses: two api processes on one
// PostgreSQL. With the second's access cache warm (a key just used there
// successfully), revoking the key, removing the binding, revoking an
// agent's delegation, suspending the agent, removing its person's
// binding, or suspending the tenant through the first makes the second
// refuse within 5 s, with
// the exact code, although its cached entries would live 10 s (decision)
// and 30 s (authentication): the change's poke crosses over NOTIFY and
// drops the cache.
func TestAccessCacheRevocationAcrossProcesses(t *testing.T) {
	db := storetest.NewTestPostgres(t)
	e := testenv.Start(t, db, testenv.Options{})
	b := startSecondAPI(t, e)
	ctx := context.Background()
	tenant, err := e.Client.CreateTenant(ctx, "", "cache")
	if err != nil {
		t.Fatal(err)
	}
	waitCacheServes(t, db, newCacheIdentity(t, e, b, tenant.ID, "probe", "viewer"))

	t.Run("key revoked", func(t *testing.T) {
		c := newCacheIdentity(t, e, b, tenant.ID, "revoked", "viewer")
		c.warm(t)
		if err := e.Client.Call(ctx, "apiKeys.revoke", map[string]any{"id": c.keyID}, nil); err != nil {
			t.Fatal(err)
		}
		refusedWithin(t, 5*time.Second, client.ErrUnauthenticated, func() error { _, err := c.onB.Nodes(ctx); return err })
	})
	t.Run("binding removed", func(t *testing.T) {
		c := newCacheIdentity(t, e, b, tenant.ID, "unbound", "viewer")
		c.warm(t)
		if err := e.Client.Call(ctx, "bindings.delete", map[string]any{"tenant_id": tenant.ID, "id": c.binding}, nil); err != nil {
			t.Fatal(err)
		}
		refusedWithin(t, 5*time.Second, client.ErrAccessDenied, func() error { _, err := c.onB.Nodes(ctx); return err })
	})
	// An agent acting for a person, both viewers: the agent's cached
	// read ends with its delegation, its own suspension, or its person's
	// binding, each changed through the first process.
	agentOf := func(t *testing.T, name string) (person, agent cacheIdentity) {
		person = newCacheIdentity(t, e, b, tenant.ID, name+"-person", "viewer")
		var a struct{ ID string }
		if err := e.Client.Call(ctx, "identities.create", map[string]any{"tenant_id": tenant.ID, "name": name + "-agent", "kind": "agent", "for": person.id}, &a); err != nil {
			t.Fatal(err)
		}
		var bind struct{ ID string }
		if err := e.Client.Call(ctx, "bindings.create", map[string]any{"tenant_id": tenant.ID, "identity_id": a.ID, "role_id": "viewer"}, &bind); err != nil {
			t.Fatal(err)
		}
		k, err := e.Client.CreateAPIKey(ctx, tenant.ID, a.ID, name+"-agent", 0)
		if err != nil {
			t.Fatal(err)
		}
		agent = cacheIdentity{id: a.ID, binding: bind.ID, keyID: k.ID, onB: client.New("http://"+b.APIAddr, k.Key)}
		agent.warm(t)
		return person, agent
	}
	for _, c := range []struct{ name, method, id string }{
		{"delegation revoked", "delegations.revoke", "agent"},
		{"agent suspended", "identities.suspend", "agent"},
		{"person unbound", "bindings.delete", "person-binding"},
	} {
		t.Run(c.name, func(t *testing.T) {
			person, agent := agentOf(t, strings.ReplaceAll(c.name, " ", "-"))
			id := map[string]string{"agent": agent.id, "person-binding": person.binding}[c.id]
			if err := e.Client.Call(ctx, c.method, map[string]any{"tenant_id": tenant.ID, "id": id}, nil); err != nil {
				t.Fatal(err)
			}
			refusedWithin(t, 5*time.Second, client.ErrAccessDenied, func() error { _, err := agent.onB.Nodes(ctx); return err })
		})
	}
	t.Run("tenant suspended", func(t *testing.T) {
		c := newCacheIdentity(t, e, b, tenant.ID, "suspended", "admin")
		c.warm(t)
		if _, err := e.Client.SetTenantState(ctx, tenant.ID, "suspend"); err != nil {
			t.Fatal(err)
		}
		refusedWithin(t, 5*time.Second, client.ErrTenantSuspended, func() error {
			_, err := c.onB.CreateIdentity(ctx, "", "after-suspend", "person")
			return err
		})
	})
}
