package integration

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/quota"
	"github.com/bettercompute/bettercompute/internal/server"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// expectExhausted checks a quota refusal: RESOURCE_EXHAUSTED, HTTP 429
// without Retry-After, and exactly the message naming the quota and limit.
func expectExhausted(t *testing.T, err error, k quota.Kind, limit, used, want int64) {
	t.Helper()
	var e *client.Error
	if !errors.As(err, &e) || e.Code != "RESOURCE_EXHAUSTED" || e.Status != 429 || e.RetryAfter != 0 {
		t.Fatalf("got %v, want RESOURCE_EXHAUSTED (429, no Retry-After)", err)
	}
	if msg := quota.Message(k, limit, used, want); e.Message != msg {
		t.Fatalf("message %q, want %q", e.Message, msg)
	}
}

func setQuotas(t *testing.T, e *testenv.Env, tenant string, o client.QuotaOverrides) {
	t.Helper()
	if _, err := e.Client.SetQuotas(context.Background(), tenant, o, false); err != nil {
		t.Fatalf("set quotas: %v", err)
	}
}

func outstandingTokens(t *testing.T, db *store.DB, tenant string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM join_tokens WHERE tenant_id = $1 AND used_at IS NULL`, tenant).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// parallel runs n calls of f at once and returns their errors.
func parallel(n int, f func(i int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = f(i)
		}()
	}
	close(start)
	wg.Wait()
	return errs
}

// A tenant's outstanding join tokens are bounded: joinTokens.create and
// joinTokens.createMany are refused RESOURCE_EXHAUSTED at the limit a root
// operator set, naming the quota; only root sets quotas; the tenant reads
// its own.
func TestQuotaJoinTokens(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx := context.Background()
		tenant, admin := e.TenantAdmin(t, "acme")
		setQuotas(t, e, tenant, client.QuotaOverrides{JoinTokens: client.Limit(25)})
		var many struct{ Tokens []client.JoinToken }
		if err := admin.Call(ctx, "joinTokens.createMany", map[string]any{"role": "node-tenant", "count": 20}, &many); err != nil || len(many.Tokens) != 20 {
			t.Fatalf("createMany 20: %d %v", len(many.Tokens), err)
		}
		err := admin.Call(ctx, "joinTokens.createMany", map[string]any{"role": "node-tenant", "count": 10}, nil)
		expectExhausted(t, err, quota.JoinTokens, 25, 20, 10)
		for i := range 5 {
			if _, err := admin.CreateJoinToken(ctx, "node-tenant", "", time.Hour); err != nil {
				t.Fatalf("token %d: %v", i, err)
			}
		}
		_, err = admin.CreateJoinToken(ctx, "node-tenant", "", time.Hour)
		expectExhausted(t, err, quota.JoinTokens, 25, 25, 1)
		if n := outstandingTokens(t, db, tenant); n != 25 {
			t.Fatalf("%d outstanding tokens, want 25", n)
		}
		// The refused calls wrote nothing; root is not limited.
		if _, err := e.Client.CreateJoinToken(ctx, "node", "", time.Hour); err != nil {
			t.Fatalf("root token: %v", err)
		}
		q, err := admin.Quotas(ctx, "")
		if err != nil || q.Limits.JoinTokens != 25 || q.Limits.Sandboxes != quota.Defaults().Sandboxes || q.Exempt {
			t.Fatalf("own quotas %+v %v", q, err)
		}
		if _, err := admin.SetQuotas(ctx, tenant, client.QuotaOverrides{JoinTokens: client.Limit(1 << 30)}, false); !errors.Is(err, client.ErrAccessDenied) {
			t.Fatalf("a tenant set its own quotas: %v, want ACCESS_DENIED", err)
		}
		if _, err := e.Client.SetQuotas(ctx, tenant, client.QuotaOverrides{JoinTokens: client.Limit(-1)}, false); !errors.Is(err, client.ErrInvalidInput) {
			t.Fatalf("negative limit: %v, want INVALID_INPUT", err)
		}
		// Reset returns to the default.
		if q, err := e.Client.SetQuotas(ctx, tenant, client.QuotaOverrides{}, true); err != nil || q.Limits != (client.QuotaLimits(quota.Defaults())) {
			t.Fatalf("reset: %+v %v", q, err)
		}
	})
}

// Parallel bulk calls never take a tenant past its join-token quota: calls
// of one chunk are admitted whole or not at all, and calls of many chunks
// (each chunk admitted in its own short transaction) leave no tokens of a
// refused call behind.
func TestQuotaJoinTokensParallel(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx := context.Background()

		one, admin := e.TenantAdmin(t, "one-chunk")
		setQuotas(t, e, one, client.QuotaOverrides{JoinTokens: client.Limit(1000)})
		res := parallel(10, func(int) error {
			return admin.Call(ctx, "joinTokens.createMany", map[string]any{"role": "node-tenant", "count": 300}, nil)
		})
		ok := admitted(t, "parallel createMany", res)
		if ok != 3 || outstandingTokens(t, db, one) != 900 {
			t.Fatalf("%d of 10 calls of 300 admitted under 1000, %d tokens outstanding; want 3 and 900", ok, outstandingTokens(t, db, one))
		}

		multi, admin2 := e.TenantAdmin(t, "many-chunks")
		setQuotas(t, e, multi, client.QuotaOverrides{JoinTokens: client.Limit(3000)})
		count := 3 * nodes.TokenChunk / 2 * 2 // three chunks
		res = parallel(6, func(int) error {
			return admin2.Call(ctx, "joinTokens.createMany", map[string]any{"role": "node-tenant", "count": count}, nil)
		})
		ok = admitted(t, "parallel createMany", res)
		if n := outstandingTokens(t, db, multi); n > 3000 || n != ok*count {
			t.Fatalf("%d tokens outstanding after %d admitted calls of %d (quota 3000)", n, ok, count)
		}
	})
}

// joinQuotaNode joins a node to tenant with a token the tenant's admin
// made (not started: its commands stay queued).
func joinQuotaNode(t *testing.T, e *testenv.Env, admin *client.Client, name string) string {
	t.Helper()
	ctx := context.Background()
	tok, err := admin.CreateJoinToken(ctx, "node-tenant", name, time.Hour)
	if err != nil {
		t.Fatalf("token: %v", err)
	}
	rec, err := daemon.Join(ctx, daemon.JoinOptions{DataDir: filepath.Join(e.Dir, "nodes", name), Gateway: e.CP.GatewayAddr, Token: tok.Token, Name: name})
	if err != nil {
		t.Fatalf("join: %v", err)
	}
	return rec.NodeID
}

// A tenant's commands in flight (queued, sent, running) are bounded at
// commands.create and commands.fanout, also under parallel calls; and one
// bulk call is capped at 10,000 (INVALID_INPUT above it).
func TestQuotaCommandsInFlight(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx := context.Background()
		tenant, admin := e.TenantAdmin(t, "acme")
		node := joinQuotaNode(t, e, admin, "acme-1")
		setQuotas(t, e, tenant, client.QuotaOverrides{CommandsInFlight: client.Limit(5)})
		for i := range 5 {
			if _, err := admin.CreateCommand(ctx, node, "diag.run", nil); err != nil {
				t.Fatalf("command %d: %v", i, err)
			}
		}
		_, err := admin.CreateCommand(ctx, node, "diag.run", nil)
		expectExhausted(t, err, quota.CommandsInFlight, 5, 5, 1)
		err = admin.Call(ctx, "commands.fanout", map[string]any{"node_ids": []string{node}, "kind": "diag.run"}, nil)
		expectExhausted(t, err, quota.CommandsInFlight, 5, 5, 1)

		other, admin2 := e.TenantAdmin(t, "busy")
		node2 := joinQuotaNode(t, e, admin2, "busy-1")
		setQuotas(t, e, other, client.QuotaOverrides{CommandsInFlight: client.Limit(7)})
		res := parallel(20, func(int) error {
			_, err := admin2.CreateCommand(ctx, node2, "diag.run", nil)
			return err
		})
		ok := admitted(t, "parallel create", res)
		var n int
		if err := db.QueryRow(`SELECT COUNT(*) FROM commands WHERE tenant_id = $1`, other).Scan(&n); err != nil || ok != 7 || n != 7 {
			t.Fatalf("%d of 20 parallel creates admitted, %d commands stored (%v); want 7", ok, n, err)
		}

		// The bulk caps: 10,000 per call.
		ids := make([]string, 10001)
		for i := range ids {
			ids[i] = node
		}
		_, err = e.CP.Commands.CreateMany(ctx, audit.Entry{TenantID: "root", Actor: "test"}, ids, "diag.run", nil, 0)
		if errs.CodeOf(err) != errs.InvalidInput || errs.SafeMessage(err) != "node_ids: between 1 and 10000 nodes" {
			t.Fatalf("fan-out of 10,001: %v", err)
		}
		err = e.Client.Call(ctx, "joinTokens.createMany", map[string]any{"role": "node", "count": nodes.MaxBulkTokens + 1}, nil)
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Code != "INVALID_INPUT" || ce.Message != `field "count": an integer from 1 to 10000` {
			t.Fatalf("createMany of 10,001: %v", err)
		}
	})
}

// startQuotaSandboxes starts one sandbox host (8192 MiB, 64 slots) with
// the given default quotas.
func startQuotaSandboxes(t *testing.T, db *store.DB, q quota.Limits) (*testenv.Env, string) {
	t.Helper()
	rt := sandboxRuntime(t)
	e := testenv.Start(t, db, testenv.Options{Nodes: 1, SandboxRuntime: rt, Tune: func(o *server.Options) { o.Quotas = q }})
	return e, rt
}

func tenantWithImage(t *testing.T, e *testenv.Env, name string) (string, *client.Client) {
	t.Helper()
	tenant, admin := e.TenantAdmin(t, name)
	if _, err := e.CP.Sandboxes.ImportBytes(context.Background(), audit.Entry{TenantID: tenant, Actor: "test"}, tenant, "busybox", busyboxTar(t)); err != nil {
		t.Fatalf("import: %v", err)
	}
	return tenant, admin
}

func createTemplate(admin *client.Client, rt, name string, memoryMB int64, warm int) (string, error) {
	var out struct{ ID string }
	err := admin.Call(context.Background(), "templates.create", map[string]any{"name": name, "image": "busybox", "runtime": rt,
		"limits": map[string]any{"cpu_millis": 100, "memory_mb": memoryMB, "pids": 64, "disk_mb": 32}, "lifetime_seconds": 600,
		"max_lifetime_seconds": 1200, "warm": warm}, &out)
	return out.ID, err
}

// A tenant's live sandboxes are bounded, on a cold start and on a warm
// claim alike, also under parallel creates.
func TestQuotaSandboxes(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e, rt := startQuotaSandboxes(t, db, quota.Defaults())
		ctx := context.Background()
		tenant, admin := tenantWithImage(t, e, "acme")
		setQuotas(t, e, tenant, client.QuotaOverrides{Sandboxes: client.Limit(2)})
		if _, err := createTemplate(admin, rt, "small", 64, 0); err != nil {
			t.Fatal(err)
		}
		warmID, err := createTemplate(admin, rt, "warm", 64, 1)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			if _, err := admin.CreateSandbox(ctx, "", "small"); err != nil {
				t.Fatalf("sandbox %d: %v", i, err)
			}
		}
		_, err = admin.CreateSandbox(ctx, "", "small")
		expectExhausted(t, err, quota.Sandboxes, 2, 2, 1)
		// A warm sandbox is there to claim, and the claim is refused too.
		waitWarm(t, sandboxEnv{Env: e}, warmID, 1)
		_, err = admin.CreateSandbox(ctx, "", "warm")
		expectExhausted(t, err, quota.Sandboxes, 2, 2, 1)
		if n, _ := e.CP.Sandboxes.WarmCount(ctx, warmID); n != 1 {
			t.Fatalf("the refused claim took the warm sandbox (%d warm)", n)
		}

		setQuotas(t, e, tenant, client.QuotaOverrides{Sandboxes: client.Limit(5)})
		res := parallel(6, func(int) error {
			_, err := admin.CreateSandbox(ctx, "", "small")
			return err
		})
		ok := admitted(t, "parallel create", res)
		var live int
		if err := db.QueryRow(`SELECT COUNT(*) FROM sandboxes WHERE tenant_id = $1 AND claimed <> 0 AND state IN ('starting', 'running')`, tenant).Scan(&live); err != nil || ok != 3 || live != 5 {
			t.Fatalf("%d of 6 parallel creates admitted, %d live (%v); want 3 and 5", ok, live, err)
		}
	})
}

// One tenant's warm pools cannot take the host capacity the others need:
// the warm-pool memory quota refuses a template past it, another tenant
// still gets its sandbox, and templates.delete drains the pool so the
// capacity it held is free for others.
func TestQuotaWarmPoolsLeaveCapacity(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		q := quota.Defaults()
		q.WarmMemoryMB = 4096 // half of the one host's 8192 MiB
		e, rt := startQuotaSandboxes(t, db, q)
		ctx := context.Background()
		greedyTenant, greedy := tenantWithImage(t, e, "greedy")
		_, quiet := tenantWithImage(t, e, "quiet")

		pool, err := createTemplate(greedy, rt, "pool", 1024, 4)
		if err != nil {
			t.Fatalf("a pool within the quota: %v", err)
		}
		_, err = createTemplate(greedy, rt, "more", 512, 8)
		expectExhausted(t, err, quota.WarmMemoryMB, 4096, 4096, 4096)
		waitWarm(t, sandboxEnv{Env: e}, pool, 4)

		if _, err := createTemplate(quiet, rt, "big", 4096, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := quiet.CreateSandbox(ctx, "", "big"); err != nil {
			t.Fatalf("another tenant's sandbox beside a full warm pool: %v", err)
		}
		_, err = quiet.CreateSandbox(ctx, "", "big")
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Code != "INVALID_STATE" || ce.Message != "no host has capacity for the template" {
			t.Fatalf("the host is full: %v, want INVALID_STATE no capacity", err)
		}

		drained, _, err := greedy.DeleteTemplate(ctx, pool)
		if err != nil || drained != 4 {
			t.Fatalf("templates.delete: drained %d, %v", drained, err)
		}
		if n, _ := e.CP.Sandboxes.WarmCount(ctx, pool); n != 0 {
			t.Fatalf("%d warm sandboxes left after the template's deletion", n)
		}
		if _, err := quiet.CreateSandbox(ctx, "", "big"); err != nil {
			t.Fatalf("create after the pool was drained: %v", err)
		}
		var list struct{ Templates []json.RawMessage }
		if err := greedy.Call(ctx, "templates.list", map[string]any{}, &list); err != nil || len(list.Templates) != 0 {
			t.Fatalf("templates left: %d %v", len(list.Templates), err)
		}
		if _, _, err := greedy.DeleteTemplate(ctx, pool); !errors.Is(err, client.ErrAccessDenied) {
			t.Fatalf("deleting it again: %v, want ACCESS_DENIED (as any missing resource)", err)
		}
		// The denial names the id the caller gave, never the tenant holding it.
		if _, _, err := quiet.DeleteTemplate(ctx, pool); !errors.Is(err, client.ErrAccessDenied) || strings.Contains(err.Error(), greedyTenant) {
			t.Fatalf("another tenant's delete: %v", err)
		}
		// The quota is free again too.
		if _, err := createTemplate(greedy, rt, "again", 1024, 4); err != nil {
			t.Fatalf("a pool after the deletion: %v", err)
		}
	})
}

// subtreeCount counts rows of table held by tenants (a top-level tenant
// and those under it) matching where.
func subtreeCount(t *testing.T, db *store.DB, table, where string, tenants ...string) int {
	t.Helper()
	total := 0
	for _, tn := range tenants {
		var n int
		if err := db.QueryRow(`SELECT COUNT(*) FROM `+table+` WHERE tenant_id = $1 AND `+where, tn).Scan(&n); err != nil {
			t.Fatal(err)
		}
		total += n
	}
	return total
}

// A quota is held by the top-level tenant: what its child (and
// grandchild) tenants hold is charged to it and limited by its limits, so
// a tenant admin making child tenants gets no more; a quota is set only on
// a top-level tenant; and parallel calls from parent and child together
// never take the top-level tenant past its limit.
func TestQuotaChildTenants(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx := context.Background()
		child := func(parent string, admin *client.Client, name string) (string, *client.Client) {
			t.Helper()
			tn, err := admin.CreateTenant(ctx, parent, name)
			if err != nil {
				t.Fatalf("child tenant: %v", err)
			}
			return tn.ID, e.IdentityClient(t, tn.ID, name+"-admin", "admin")
		}

		// Join tokens, one call at a time: parent, child and grandchild
		// share the parent's 3.
		top, admin := e.TenantAdmin(t, "acme")
		setQuotas(t, e, top, client.QuotaOverrides{JoinTokens: client.Limit(3)})
		kid, kidAdmin := child(top, admin, "acme-kid")
		grand, grandAdmin := child(kid, kidAdmin, "acme-grand")
		for i, c := range []*client.Client{admin, kidAdmin, grandAdmin} {
			if _, err := c.CreateJoinToken(ctx, "node-tenant", "", time.Hour); err != nil {
				t.Fatalf("token %d: %v", i, err)
			}
		}
		for _, c := range []*client.Client{kidAdmin, grandAdmin, admin} {
			_, err := c.CreateJoinToken(ctx, "node-tenant", "", time.Hour)
			expectExhausted(t, err, quota.JoinTokens, 3, 3, 1)
		}
		err := kidAdmin.Call(ctx, "joinTokens.createMany", map[string]any{"role": "node-tenant", "count": 50}, nil)
		expectExhausted(t, err, quota.JoinTokens, 3, 3, 50)
		if n := subtreeCount(t, db, "join_tokens", "used_at IS NULL", top, kid, grand); n != 3 {
			t.Fatalf("%d tokens outstanding in the subtree, want 3", n)
		}
		// A child reads its top-level tenant's limits; its own cannot be set.
		if q, err := kidAdmin.Quotas(ctx, ""); err != nil || q.Limits.JoinTokens != 3 {
			t.Fatalf("child's quotas %+v %v", q, err)
		}
		if _, err := e.Client.SetQuotas(ctx, kid, client.QuotaOverrides{JoinTokens: client.Limit(100)}, false); !errors.Is(err, client.ErrInvalidState) {
			t.Fatalf("set quotas on a child tenant: %v, want INVALID_STATE", err)
		}

		// Join tokens in parallel from parent and child.
		ptop, padmin := e.TenantAdmin(t, "para")
		pkid, pkidAdmin := child(ptop, padmin, "para-kid")
		setQuotas(t, e, ptop, client.QuotaOverrides{JoinTokens: client.Limit(7)})
		res := parallel(20, func(i int) error {
			c := padmin
			if i%2 == 1 {
				c = pkidAdmin
			}
			_, err := c.CreateJoinToken(ctx, "node-tenant", "", time.Hour)
			return err
		})
		ok := admitted(t, "parallel token", res)
		if n := subtreeCount(t, db, "join_tokens", "used_at IS NULL", ptop, pkid); ok != 7 || n != 7 {
			t.Fatalf("%d of 20 parallel tokens admitted, %d outstanding in the subtree; want 7", ok, n)
		}

		// Commands in flight, in parallel from parent and child, each on a
		// node of its own tenant.
		ctop, cadmin := e.TenantAdmin(t, "cmds")
		ckid, ckidAdmin := child(ctop, cadmin, "cmds-kid")
		pnode := joinQuotaNode(t, e, cadmin, "cmds-1")
		knode := joinQuotaNode(t, e, ckidAdmin, "cmds-kid-1")
		setQuotas(t, e, ctop, client.QuotaOverrides{CommandsInFlight: client.Limit(5)})
		res = parallel(20, func(i int) error {
			c, node := cadmin, pnode
			if i%2 == 1 {
				c, node = ckidAdmin, knode
			}
			_, err := c.CreateCommand(ctx, node, "diag.run", nil)
			return err
		})
		ok = admitted(t, "parallel command", res)
		if n := subtreeCount(t, db, "commands", "1 = 1", ctop, ckid); ok != 5 || n != 5 {
			t.Fatalf("%d of 20 parallel commands admitted, %d stored in the subtree; want 5", ok, n)
		}
		_, err = ckidAdmin.CreateCommand(ctx, knode, "diag.run", nil)
		expectExhausted(t, err, quota.CommandsInFlight, 5, 5, 1)
		err = ckidAdmin.Call(ctx, "commands.fanout", map[string]any{"node_ids": []string{knode}, "kind": "diag.run"}, nil)
		expectExhausted(t, err, quota.CommandsInFlight, 5, 5, 1)
	})
}

// Live sandboxes of a child tenant count against its top-level tenant's
// sandboxes quota, like the top-level tenant's own.
func TestQuotaSandboxesChildTenants(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e, rt := startQuotaSandboxes(t, db, quota.Defaults())
		ctx := context.Background()
		top, admin := tenantWithImage(t, e, "acme")
		setQuotas(t, e, top, client.QuotaOverrides{Sandboxes: client.Limit(2)})
		kid, err := admin.CreateTenant(ctx, top, "acme-kid")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.CP.Sandboxes.ImportBytes(ctx, audit.Entry{TenantID: kid.ID, Actor: "test"}, kid.ID, "busybox", busyboxTar(t)); err != nil {
			t.Fatalf("import: %v", err)
		}
		kidAdmin := e.IdentityClient(t, kid.ID, "kid-admin", "admin")
		for _, c := range []*client.Client{admin, kidAdmin} {
			if _, err := createTemplate(c, rt, "small", 64, 0); err != nil {
				t.Fatal(err)
			}
			if _, err := c.CreateSandbox(ctx, "", "small"); err != nil {
				t.Fatalf("sandbox: %v", err)
			}
		}
		for _, c := range []*client.Client{kidAdmin, admin} {
			_, err := c.CreateSandbox(ctx, "", "small")
			expectExhausted(t, err, quota.Sandboxes, 2, 2, 1)
		}
	})
}

// admitted counts the calls in res that succeeded; any failure but
// RESOURCE_EXHAUSTED fails the test, named by what.
func admitted(t *testing.T, what string, res []error) int {
	t.Helper()
	ok := 0
	for _, err := range res {
		switch {
		case err == nil:
			ok++
		case !errors.Is(err, client.ErrResourceExhausted):
			t.Fatalf("%s: %v", what, err)
		}
	}
	return ok
}
