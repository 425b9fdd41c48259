package api_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// errorOf is an error answer's code and message, without the request id.
func errorOf(t *testing.T, r reply) string {
	t.Helper()
	var eb struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(r.body, &eb); err != nil {
		t.Fatalf("not an error body: %s", r.body)
	}
	return eb.Error.Code + ": " + eb.Error.Message
}

// sameAnswer fails unless another tenant's object and a missing one get
// one status, code and message (but for the action and the id the caller
// named, which a denial repeats).
func sameAnswer(t *testing.T, what string, foreign, missing reply, status int, code string) {
	t.Helper()
	expectCode(t, foreign, status, code)
	expectCode(t, missing, status, code)
	// A denial names the id the caller gave: compare without it.
	if foreign.denialShape() != missing.denialShape() {
		t.Fatalf("%s: another tenant's answers %q, a missing one %q", what, errorOf(t, foreign), errorOf(t, missing))
	}
}

// roles.delete deletes a tenant's own role and its bindings; another
// tenant's role answers NOT_FOUND exactly as a missing one (and stays), a
// built-in role INVALID_STATE.
func TestRolesDelete(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		_, adminA := e.TenantAdmin(t, "roles-a")
		_, adminB := e.TenantAdmin(t, "roles-b")
		keyA, keyB := clientKey(t, adminA), clientKey(t, adminB)
		call := func(key, method, body string) reply { return do(t, e, "POST", "/api/v1/"+method, key, nil, body) }
		mk := func(key string) string {
			r := call(key, "roles.create", `{"name":"lister","statements":[{"effect":"allow","actions":["compute:nodes:list"],"resources":["*"]}]}`)
			expectCode(t, r, 200, "")
			var out struct{ ID string }
			_ = json.Unmarshal(r.body, &out)
			return out.ID
		}
		roleA, roleB := mk(keyA), mk(keyB)
		sameAnswer(t, "roles.delete", call(keyA, "roles.delete", `{"id":"`+roleB+`"}`), call(keyA, "roles.delete", `{"id":"rzzzzzzzzzzzzzzzz"}`), 404, "NOT_FOUND")
		expectCode(t, call(keyA, "roles.delete", `{"id":"admin"}`), 409, "INVALID_STATE")
		expectCode(t, call(keyA, "roles.delete", `{}`), 400, "INVALID_INPUT")
		expectCode(t, call(keyA, "roles.delete", `{"id":"`+roleA+`"}`), 200, "")
		expectCode(t, call(keyA, "roles.delete", `{"id":"`+roleA+`"}`), 404, "NOT_FOUND")
		var n int
		if err := db.QueryRowContext(context.Background(), `SELECT COUNT(*) FROM roles WHERE id = $1`, roleB).Scan(&n); err != nil || n != 1 {
			t.Fatalf("tenant B's role is gone (%d, %v)", n, err)
		}
	})
}

// joinTokens.list shows a tenant's own tokens (never their secrets, never
// another tenant's); joinTokens.revoke revokes an unused one, which then
// lists as revoked; another tenant's token answers NOT_FOUND exactly as a
// missing one and stays usable.
func TestJoinTokensListAndRevoke(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx := context.Background()
		_, adminA := e.TenantAdmin(t, "tokens-a")
		_, adminB := e.TenantAdmin(t, "tokens-b")
		keyA := clientKey(t, adminA)
		tokA, err := adminA.CreateJoinToken(ctx, "", "a", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		tokB, err := adminB.CreateJoinToken(ctx, "", "b", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		call := func(key, method, body string) reply { return do(t, e, "POST", "/api/v1/"+method, key, nil, body) }
		sameAnswer(t, "joinTokens.revoke", call(keyA, "joinTokens.revoke", `{"id":"`+tokB.ID+`"}`), call(keyA, "joinTokens.revoke", `{"id":"jt_zzzzzzzzzzzzzzzz"}`), 404, "NOT_FOUND")
		expectCode(t, call(keyA, "joinTokens.revoke", `{"id":"`+tokA.ID+`"}`), 200, "")
		expectCode(t, call(keyA, "joinTokens.revoke", `{"id":"`+tokA.ID+`"}`), 404, "NOT_FOUND")

		ts, err := adminA.JoinTokens(ctx, "")
		if err != nil || len(ts) != 1 || ts[0].ID != tokA.ID || ts[0].State != "revoked" || ts[0].RevokedAt == nil {
			t.Fatalf("tenant A's tokens: %+v %v", ts, err)
		}
		r := call(keyA, "joinTokens.list", `{}`)
		if json.Valid(r.body) && (contains(r.body, tokA.Token) || contains(r.body, tokB.ID)) {
			t.Fatalf("the listing shows a secret or another tenant's token: %s", r.body)
		}
		tsB, err := adminB.JoinTokens(ctx, "")
		if err != nil || len(tsB) != 1 || tsB[0].State != "outstanding" {
			t.Fatalf("tenant B's token: %+v %v", tsB, err)
		}
	})
}

// commands.cancel cancels a queued command (it is never delivered); a
// cancelled one answers INVALID_STATE; another tenant's command answers
// exactly as a missing one (the one denial) and stays queued.
func TestCommandsCancel(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx := context.Background()
		if _, err := db.ExecContext(ctx, `INSERT INTO nodes (id, tenant_id, name, role, created_at) VALUES ('ncancelxxxxxxxxxx', 'root', 'offline', 'node', 0)`); err != nil {
			t.Fatal(err)
		}
		_, adminB := e.TenantAdmin(t, "cancel-b")
		keyB := clientKey(t, adminB)
		c1, err := e.Client.CreateCommand(ctx, "ncancelxxxxxxxxxx", "node.ping", nil)
		if err != nil {
			t.Fatal(err)
		}
		call := func(key, method, body string) reply { return do(t, e, "POST", "/api/v1/"+method, key, nil, body) }
		sameAnswer(t, "commands.cancel", call(keyB, "commands.cancel", `{"id":"`+c1.ID+`"}`), call(keyB, "commands.cancel", `{"id":"czzzzzzzzzzzzzzzz"}`), 403, "ACCESS_DENIED")
		if c, err := e.Client.Command(ctx, c1.ID); err != nil || c.State != "queued" {
			t.Fatalf("after another tenant's cancel: %+v %v", c, err)
		}
		got, err := e.Client.CancelCommand(ctx, c1.ID)
		if err != nil || got.State != "cancelled" {
			t.Fatalf("cancel: %+v %v", got, err)
		}
		expectCode(t, call(e.AdminKey, "commands.cancel", `{"id":"`+c1.ID+`"}`), 409, "INVALID_STATE")
		if c, err := e.Client.Command(ctx, c1.ID); err != nil || c.State != "cancelled" {
			t.Fatalf("after cancel: %+v %v", c, err)
		}
		// A command a node has seen is not cancelled: one sent, and one
		// queued again after a delivery its node did not report on (it
		// keeps the session it was sent on).
		for _, state := range []string{"sent", "queued"} {
			c, err := e.Client.CreateCommand(ctx, "ncancelxxxxxxxxxx", "node.ping", nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, `UPDATE commands SET state = $1, sent_session = 'gs-seen' WHERE id = $2`, state, c.ID); err != nil {
				t.Fatal(err)
			}
			expectCode(t, call(e.AdminKey, "commands.cancel", `{"id":"`+c.ID+`"}`), 409, "INVALID_STATE")
			if got, err := e.Client.Command(ctx, c.ID); err != nil || got.State != state {
				t.Fatalf("%s command after a refused cancel: %+v %v", state, got, err)
			}
		}
	})
}

// identities.whoami names the caller's identity, tenant and key.
func TestWhoami(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	ctx := context.Background()
	tenant, admin := e.TenantAdmin(t, "who")
	w, err := admin.Whoami(ctx)
	if err != nil || w.TenantID != tenant || w.IdentityName != "who-admin" || w.KeyID == "" || w.Kind != "person" {
		t.Fatalf("whoami: %+v %v", w, err)
	}
	root, err := e.Client.Whoami(ctx)
	if err != nil || root.TenantID != "root" {
		t.Fatalf("root's whoami: %+v %v", root, err)
	}
}

func contains(b []byte, s string) bool {
	return len(s) > 0 && string(b) != "" && strings.Contains(string(b), s)
}

// nodes.delete revokes a node's certificates (its session goes down) and
// takes it out of every lookup: a later get, delete or command answers as
// for a node that never was. Another tenant's delete answers exactly as a
// missing node's and leaves the node up.
func TestNodesDelete(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 2})
		ctx := context.Background()
		_, adminB := e.TenantAdmin(t, "nodes-b")
		keyB := clientKey(t, adminB)
		victim, bystander := e.Nodes[0], e.Nodes[1]
		call := func(key, method, body string) reply { return do(t, e, "POST", "/api/v1/"+method, key, nil, body) }
		sameAnswer(t, "nodes.delete", call(keyB, "nodes.delete", `{"id":"`+victim.NodeID()+`"}`), call(keyB, "nodes.delete", `{"id":"nzzzzzzzzzzzzzzzz"}`), 403, "ACCESS_DENIED")
		if !victim.Connected() {
			t.Fatal("another tenant's delete took the node down")
		}
		if err := e.Client.DeleteNode(ctx, victim.NodeID()); err != nil {
			t.Fatalf("nodes.delete: %v", err)
		}
		victim.WaitDisconnected(t)
		expectCode(t, call(e.AdminKey, "nodes.get", `{"id":"`+victim.NodeID()+`"}`), 404, "NOT_FOUND")
		expectCode(t, call(e.AdminKey, "nodes.delete", `{"id":"`+victim.NodeID()+`"}`), 404, "NOT_FOUND")
		expectCode(t, call(e.AdminKey, "commands.create", `{"node_id":"`+victim.NodeID()+`","kind":"node.ping"}`), 404, "NOT_FOUND")
		ns, err := e.Client.Nodes(ctx)
		if err != nil || len(ns) != 1 || ns[0].ID != bystander.NodeID() {
			t.Fatalf("nodes after the delete: %+v %v", ns, err)
		}
		var reason string
		if err := db.QueryRowContext(ctx, `SELECT revoke_reason FROM node_certs WHERE node_id = $1 AND revoked_at IS NOT NULL`, victim.NodeID()).Scan(&reason); err != nil || reason != "node-deleted" {
			t.Fatalf("the deleted node's certificate: %q %v", reason, err)
		}
	})
}
