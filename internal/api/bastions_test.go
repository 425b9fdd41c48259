package api_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// TestBastionsNoExistenceOracle: for a tenant's admin, another tenant's
// bastion answers every bastion method byte for byte as a bastion that
// does not exist and as a node that is not a bastion (the id it sent
// aside); the root admin gets NOT_FOUND for a missing one and for a plain
// node alike, and sees the other tenant's bastion.
func TestBastionsNoExistenceOracle(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx := context.Background()
		tenantA, adminA := e.TenantAdmin(t, "tenant-a")
		tenantB, _ := e.TenantAdmin(t, "tenant-b")
		for id, row := range map[string][2]string{"nbastionbbbbbbbb": {tenantB, "bastion"}, "nplainaaaaaaaaaa": {tenantA, "node"}, "nbastionaaaaaaaa": {tenantA, "bastion"}} {
			if _, err := db.ExecContext(ctx, `INSERT INTO nodes (id, tenant_id, name, role, created_at) VALUES ($1, $2, $1, $3, 0)`, id, row[0], row[1]); err != nil {
				t.Fatal(err)
			}
		}
		keyA := clientKey(t, adminA)
		bodies := map[string]string{
			"bastions.get":    `{"id":"ID"}`,
			"bastions.grants": `{"bastion_id":"ID"}`,
			"bastions.grant":  `{"bastion_id":"ID","allow":["inference"]}`,
			"bastions.unpair": `{"id":"ID"}`,
		}
		for method, body := range bodies {
			var shapes []string
			for _, id := range []string{"nbastionbbbbbbbb", "nmissingxxxxxxxx", "nplainaaaaaaaaaa"} {
				r := do(t, e, "POST", "/api/v1/"+method, keyA, nil, strings.ReplaceAll(body, "ID", id))
				expectCode(t, r, 403, "ACCESS_DENIED")
				shapes = append(shapes, strings.ReplaceAll(r.withoutRequestID(), id, "ID"))
			}
			if shapes[0] != shapes[1] || shapes[1] != shapes[2] {
				t.Fatalf("%s answers differ:\n%s", method, strings.Join(shapes, "\n"))
			}
			for _, id := range []string{"nmissingxxxxxxxx", "nplainaaaaaaaaaa"} {
				r := do(t, e, "POST", "/api/v1/"+method, e.AdminKey, nil, strings.ReplaceAll(body, "ID", id))
				expectCode(t, r, 404, "NOT_FOUND")
				if r.message() != "bastion not found" {
					t.Fatalf("root %s %s: %s", method, id, r.body)
				}
			}
		}
		// Tenant A sees its own bastion, and only it; root sees both.
		expectCode(t, do(t, e, "POST", "/api/v1/bastions.get", keyA, nil, `{"id":"nbastionaaaaaaaa"}`), 200, "")
		var ls struct{ Bastions []map[string]any }
		if err := adminA.Call(ctx, "bastions.list", map[string]any{}, &ls); err != nil || len(ls.Bastions) != 1 || ls.Bastions[0]["id"] != "nbastionaaaaaaaa" {
			t.Fatalf("tenant A lists %+v (%v)", ls, err)
		}
		expectCode(t, do(t, e, "POST", "/api/v1/bastions.list", keyA, nil, `{"tenant_id":"`+tenantB+`"}`), 403, "ACCESS_DENIED")
		expectCode(t, do(t, e, "POST", "/api/v1/bastions.get", e.AdminKey, nil, `{"id":"nbastionbbbbbbbb"}`), 200, "")
	})
}

// TestJoinTokenNeverBastion: the join-token methods refuse role bastion
// (INVALID_INPUT), for root too; bastions.pairToken makes one, shown once.
func TestJoinTokenNeverBastion(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	for _, c := range []struct{ method, body string }{
		{"joinTokens.create", `{"role":"bastion"}`},
		{"joinTokens.createMany", `{"role":"bastion","count":2}`},
	} {
		r := do(t, e, "POST", "/api/v1/"+c.method, e.AdminKey, nil, c.body)
		expectCode(t, r, 400, "INVALID_INPUT")
		if r.message() != "role: a bastion's pairing token is made by bastions.pairToken, never as a join token" {
			t.Fatalf("%s: %s", c.method, r.body)
		}
	}
	r := do(t, e, "POST", "/api/v1/bastions.pairToken", e.AdminKey, nil, `{"name":"laptop"}`)
	expectCode(t, r, 200, "")
	var tok map[string]any
	if err := json.Unmarshal(r.body, &tok); err != nil || tok["token"] == "" || tok["token_id"] == "" || tok["expires_at"] == "" || len(tok) != 3 {
		t.Fatalf("pair token answer %s", r.body)
	}
	r = do(t, e, "POST", "/api/v1/joinTokens.list", e.AdminKey, nil, `{}`)
	if !strings.Contains(string(r.body), `"role": "bastion"`) {
		t.Fatalf("the pairing token is not a join token of role bastion: %s", r.body)
	}
}
