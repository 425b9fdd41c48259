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
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// joinTenantNode joins and starts a tenant-controlled sim node in tenant (a
// machine a non-root tenant joins is tenant-controlled) and waits until
// its session is up.
func joinTenantNode(t *testing.T, e *testenv.Env, tenant, name string) *testenv.Node {
	t.Helper()
	ctx := context.Background()
	tok, err := e.CP.Nodes.CreateJoinToken(ctx, audit.Entry{TenantID: tenant, Actor: "test"}, pki.RoleNodeTenant, name, time.Hour)
	if err != nil {
		t.Fatalf("join token: %v", err)
	}
	dir := filepath.Join(e.Dir, "nodes", tok.ID)
	if _, err := daemon.Join(ctx, daemon.JoinOptions{DataDir: dir, Gateway: e.CP.GatewayAddr, Token: tok.Token, Name: name}); err != nil {
		t.Fatalf("join: %v", err)
	}
	n := e.OpenNode(t, dir, "")
	n.Start(t)
	n.WaitConnected(t)
	return n
}

// Tenant A's admin names its own node and tenant B's certificate serial in
// nodes.revoke: refused exactly as for a serial never issued, B's
// certificate stays valid and B's session stays up. The same rule guards
// nodes.restrict, and a revocation's audit row is in the node's tenant.
func TestRevokeSerialMustBelongToNode(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx := context.Background()
		tenantA, adminA := e.TenantAdmin(t, "rev-a")
		tenantB, _ := e.TenantAdmin(t, "rev-b")
		nodeA := joinTenantNode(t, e, tenantA, "box-a")
		nodeB := joinTenantNode(t, e, tenantB, "box-b")

		var unknown, foreign *client.Error
		errUnknown := adminA.Call(ctx, "nodes.revoke", map[string]any{"node_id": nodeA.NodeID(), "serial": "00ff00ff00ff"}, nil)
		errForeign := adminA.Call(ctx, "nodes.revoke", map[string]any{"node_id": nodeA.NodeID(), "serial": nodeB.Serial()}, nil)
		if !errors.As(errUnknown, &unknown) || !errors.As(errForeign, &foreign) {
			t.Fatalf("revoke with a foreign serial: %v; with an unknown serial: %v; want API errors", errForeign, errUnknown)
		}
		if foreign.Code != "INVALID_INPUT" || foreign.Status != unknown.Status || foreign.Code != unknown.Code || foreign.Message != unknown.Message {
			t.Fatalf("foreign serial answers %d %s %q, an unknown one %d %s %q; want the same INVALID_INPUT",
				foreign.Status, foreign.Code, foreign.Message, unknown.Status, unknown.Code, unknown.Message)
		}
		st, err := e.CP.Nodes.CertState(ctx, nodeB.Serial())
		if err != nil || st.Revoked {
			t.Fatalf("B's certificate after A's revoke: revoked=%v (%v)", st.Revoked, err)
		}
		if !nodeB.Connected() {
			t.Fatal("B's session went down after A's revoke")
		}
		// nodes.restrict applies the same rule with the same answer.
		err = adminA.Call(ctx, "nodes.restrict", map[string]any{"node_id": nodeA.NodeID(), "serial": nodeB.Serial(), "allowed_kinds": []string{"node.ping"}}, nil)
		var restrict *client.Error
		if !errors.As(err, &restrict) || restrict.Code != foreign.Code || restrict.Message != foreign.Message {
			t.Fatalf("restrict with B's serial: %v, want %s %q", err, foreign.Code, foreign.Message)
		}
		if st, _ := e.CP.Nodes.CertState(ctx, nodeB.Serial()); st.AllowedKinds != nil {
			t.Fatalf("B's certificate was narrowed to %v", st.AllowedKinds)
		}
		// Root's admin naming A's node and B's serial is refused the same way.
		if err := e.Client.Call(ctx, "nodes.revoke", map[string]any{"node_id": nodeA.NodeID(), "serial": nodeB.Serial()}, nil); client.CodeOf(err) != "INVALID_INPUT" {
			t.Fatalf("root revoke with a mismatched serial: %v, want INVALID_INPUT", err)
		}
		if st, _ := e.CP.Nodes.CertState(ctx, nodeB.Serial()); st.Revoked {
			t.Fatal("root's mismatched revoke revoked B's certificate")
		}
		// A's own serial works, and root's revocation of A's node is
		// audited in A's tenant.
		var out struct{ Revoked int }
		if err := adminA.Call(ctx, "nodes.revoke", map[string]any{"node_id": nodeA.NodeID(), "serial": nodeA.Serial()}, &out); err != nil || out.Revoked != 1 {
			t.Fatalf("revoke own serial: %+v %v", out, err)
		}
		nodeA.WaitDisconnected(t)
		if !nodeB.Connected() {
			t.Fatal("B's session went down after A revoked its own node")
		}
		if err := e.Client.Call(ctx, "nodes.revoke", map[string]any{"node_id": nodeA.NodeID()}, nil); err != nil {
			t.Fatal(err)
		}
		var inA, inRoot int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit_events WHERE action = 'compute:nodes:revoke' AND outcome = 'allowed' AND tenant_id = $1`, tenantA).Scan(&inA); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit_events WHERE action = 'compute:nodes:revoke' AND outcome = 'allowed' AND tenant_id = 'root'`).Scan(&inRoot); err != nil {
			t.Fatal(err)
		}
		if inA != 2 || inRoot != 0 {
			t.Fatalf("revocation audit rows: %d in A, %d in root; want 2 and 0", inA, inRoot)
		}
	})
}
