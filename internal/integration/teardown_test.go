package integration

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/quota"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// Deleting a tenant tears it down as the seed says: its warm pool and its
// running sandbox are gone (deleted at once, their hosts told), its child
// tenant is deleted first, its node's certificates are revoked (the node
// is disconnected) and its unused join token can no longer join, and
// neither its keys nor its child's authenticate again. Deleting it once
// more finishes nothing left (idempotent) and answers the same.
func TestTenantDeleteTearsDown(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e, rt := startQuotaSandboxes(t, db, quota.Defaults())
		ctx := context.Background()
		tenant, admin := tenantWithImage(t, e, "doomed")
		pool, err := createTemplate(admin, rt, "pool", 64, 2)
		if err != nil {
			t.Fatal(err)
		}
		waitWarm(t, sandboxEnv{Env: e}, pool, 2)
		running, err := admin.CreateSandbox(ctx, "", "pool")
		if err != nil {
			t.Fatal(err)
		}
		child, err := admin.CreateTenant(ctx, "", "doomed-child")
		if err != nil {
			t.Fatal(err)
		}
		childAdmin := e.IdentityClient(t, child.ID, "child-admin", "admin")
		node := joinTenantNode(t, e, tenant, "doomed-node")
		spare, err := admin.CreateJoinToken(ctx, "", "spare", time.Hour)
		if err != nil {
			t.Fatal(err)
		}

		out, err := e.Client.DeleteTenant(ctx, tenant)
		if err != nil {
			t.Fatalf("tenants.delete: %v", err)
		}

		// Sandboxes: no warm one left, none live at all.
		if n, _ := e.CP.Sandboxes.WarmCount(ctx, pool); n != 0 {
			t.Fatalf("%d warm sandboxes left", n)
		}
		var live int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM sandboxes WHERE tenant_id = $1 AND state IN ('starting','warm','claiming','running')`, tenant).Scan(&live); err != nil || live != 0 {
			t.Fatalf("%d live sandboxes left (%v)", live, err)
		}
		if st := sandboxState(t, db, running.ID); st != "deleted" {
			t.Fatalf("the running sandbox is %s", st)
		}

		// Keys: neither the tenant's nor its child's authenticate.
		for name, c := range map[string]*client.Client{"tenant": admin, "child": childAdmin} {
			if _, err := e.CP.APIKeys.Authenticate(ctx, c.Key()); err == nil {
				t.Fatalf("the %s's key still authenticates", name)
			}
			if _, err := c.Whoami(ctx); !errors.Is(err, client.ErrUnauthenticated) {
				t.Fatalf("the %s's key calling: %v, want UNAUTHENTICATED", name, err)
			}
		}
		// The child was deleted too.
		if got, err := e.Client.SetTenantState(ctx, child.ID, "resume"); err == nil {
			t.Fatalf("resuming the deleted child answered %+v", got)
		}

		// Nodes: revoked and disconnected; the unused token joins nothing.
		node.WaitDisconnected(t)
		n, err := e.CP.Nodes.Get(ctx, iam.RootScope(), node.NodeID())
		if err != nil || n.StateReason != nodes.ReasonTenantDeleted {
			t.Fatalf("the tenant's node: %+v %v, want revoked %s", n, err, nodes.ReasonTenantDeleted)
		}
		if _, err := daemon.Join(ctx, daemon.JoinOptions{DataDir: filepath.Join(e.Dir, "spare"), Gateway: e.CP.GatewayAddr, Token: spare.Token, Name: "spare"}); err == nil {
			t.Fatal("a deleted tenant's join token joined a node")
		}

		// Each step wrote its audit row in the tenant.
		var rows int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit_events WHERE action = 'compute:tenants:delete' AND resource = $1`, "tenant/"+tenant).Scan(&rows); err != nil || rows != 4 {
			t.Fatalf("%d teardown audit rows (%v), want 4 (state, sandboxes, nodes, keys)", rows, err)
		}

		// The answer counts what ended.
		if out.TenantsDeleted != 2 || out.SandboxesDeleted < 3 || out.TemplatesDeleted != 1 || out.CertificatesRevoked < 1 ||
			out.JoinTokensRevoked != 1 || out.KeysRevoked < 1 {
			t.Fatalf("teardown counts: %+v", out)
		}

		// A tenant deleted before the teardown existed (only its state
		// set, its warm pool left running) is cleaned up by deleting it
		// again.
		old, oldAdmin := tenantWithImage(t, e, "deleted-before")
		oldPool, err := createTemplate(oldAdmin, rt, "pool", 64, 1)
		if err != nil {
			t.Fatal(err)
		}
		waitWarm(t, sandboxEnv{Env: e}, oldPool, 1)
		if _, err := e.CP.IAM.SetTenantState(ctx, audit.Entry{TenantID: iam.RootTenant, Actor: "before-the-fix"}, old, iam.StateDeleted); err != nil {
			t.Fatal(err)
		}
		if n, _ := e.CP.Sandboxes.WarmCount(ctx, oldPool); n < 1 {
			t.Fatalf("setup: %d warm (a refill racing the reconciler may start one more)", n)
		}
		if _, err := e.Client.DeleteTenant(ctx, old); err != nil {
			t.Fatalf("deleting a deleted tenant: %v", err)
		}
		if n, _ := e.CP.Sandboxes.WarmCount(ctx, oldPool); n != 0 {
			t.Fatalf("%d warm sandboxes left of a tenant deleted before the teardown", n)
		}
		if _, err := e.CP.APIKeys.Authenticate(ctx, oldAdmin.Key()); err == nil {
			t.Fatal("the key of a tenant deleted before the teardown still authenticates")
		}

		// Once more: nothing left to end.
		again, err := e.Client.DeleteTenant(ctx, tenant)
		if err != nil || again.SandboxesDeleted != 0 || again.KeysRevoked != 0 || again.CertificatesRevoked != 0 {
			t.Fatalf("deleting again: %+v %v", again, err)
		}
	})
}
