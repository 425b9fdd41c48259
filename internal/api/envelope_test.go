package api_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/api"
	"github.com/bettercompute/bettercompute/internal/bastions/opstest"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/idempotency"
	"github.com/bettercompute/bettercompute/internal/quorum/quorumwire"
	"github.com/bettercompute/bettercompute/internal/server"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) code() string {
	var eb api.ErrorBody
	_ = json.Unmarshal(r.body, &eb)
	return string(eb.Error.Code)
}

func (r reply) message() string {
	var eb api.ErrorBody
	_ = json.Unmarshal(r.body, &eb)
	return eb.Error.Message
}

// withoutRequestID strips the request id so two answers can be compared.
func (r reply) withoutRequestID() string {
	return regexp.MustCompile(`"request_id":\s*"[^"]*"`).ReplaceAllString(string(r.body), "")
}

// do sends a raw request; hdr may override the defaults (set a value to
// "" to drop it).
func do(t *testing.T, e *testenv.Env, method, path, key string, hdr map[string]string, body string) reply {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+e.CP.APIAddr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Better-Compute", "1")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
}

func expectCode(t *testing.T, r reply, status int, code string) {
	t.Helper()
	if r.status != status || r.code() != code {
		t.Fatalf("got %d %s (%s), want %d %s", r.status, r.code(), r.body, status, code)
	}
}

func TestCSRFAndMethods(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	k := e.AdminKey
	expectCode(t, do(t, e, "GET", "/api/v1/nodes.list", k, nil, ""), 403, "CSRF_REJECTED")
	expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", k, map[string]string{"X-Better-Compute": ""}, "{}"), 403, "CSRF_REJECTED")
	expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", k, map[string]string{"Content-Type": "text/plain"}, "{}"), 403, "CSRF_REJECTED")
	expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", k, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, "{}"), 403, "CSRF_REJECTED")
	for _, m := range []string{"TRACE", "TRACK"} {
		for _, p := range []string{"/api/v1/nodes.list", "/healthz"} {
			r := do(t, e, m, p, k, nil, "")
			expectCode(t, r, http.StatusMethodNotAllowed, "INVALID_INPUT")
			if r.header.Get("Cache-Control") != "no-store" {
				t.Fatalf("%s %s: no security headers", m, p)
			}
		}
	}
	// CONNECT, sent raw (a client library turns it into a proxy tunnel):
	// in path form to the API and to a page, and in authority form.
	for _, target := range []string{"/api/v1/nodes.list", "/healthz", e.CP.APIAddr} {
		conn, err := net.Dial("tcp", e.CP.APIAddr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Length: 0\r\n\r\n", target, e.CP.APIAddr, k)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("CONNECT %s: %v", target, err)
		}
		b, _ := io.ReadAll(resp.Body)
		conn.Close()
		expectCode(t, reply{status: resp.StatusCode, header: resp.Header, body: b}, http.StatusMethodNotAllowed, "INVALID_INPUT")
		if resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Fatalf("CONNECT %s: no security headers", target)
		}
	}
	expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", k, map[string]string{"Content-Type": "application/json; charset=utf-8"}, "{}"), 200, "")
}

func TestBodyRules(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	k := e.AdminKey
	big := `{"name":"` + strings.Repeat("a", 64<<10) + `"}`
	expectCode(t, do(t, e, "POST", "/api/v1/tenants.create", k, nil, big), 413, "PAYLOAD_TOO_LARGE")
	cases := map[string]struct{ body, msg string }{
		"array":         {`[]`, "the body must be a JSON object"},
		"unknown field": {`{"name":"a","colour":1}`, `unknown field "colour"`},
		"duplicate key": {`{"name":"a","name":"b"}`, `duplicate key "name"`},
		"nested dup":    {`{"name":"a","parent_id":"root","x":{"y":1,"y":2}}`, `duplicate key "y"`},
		"trailing":      {`{"name":"a"} {}`, "trailing data after the JSON object"},
		"wrong type":    {`{"name":7}`, `field "name": wrong type`},
		// Names match exactly: a key that differs from a field only in case
		// is unknown, so it cannot slip past the duplicate-key rule.
		"case variant":   {`{"NAME":"a"}`, `unknown field "NAME"`},
		"case duplicate": {`{"name":"a","Name":"b"}`, `unknown field "Name"`},
		"embedded case":  {`{"name":"a","Parent_ID":"root"}`, `unknown field "Parent_ID"`},
		"too long":       {`{"name":"` + strings.Repeat("a", 64) + `"}`, `field "name": at most 63 bytes`},
		"not json":       {`{"name":`, "the body is not valid JSON"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			r := do(t, e, "POST", "/api/v1/tenants.create", k, nil, c.body)
			expectCode(t, r, 400, "INVALID_INPUT")
			if r.message() != c.msg {
				t.Fatalf("message %q, want %q", r.message(), c.msg)
			}
		})
	}
}

func TestErrorShapeHeadersAndRequestID(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	for _, path := range []string{"/api/v1/nodes.list", "/api/v1/nope", "/healthz", "/.well-known/better-compute", "/metrics"} {
		method := "POST"
		if !strings.HasPrefix(path, "/api/") {
			method = "GET"
		}
		r := do(t, e, method, path, e.AdminKey, map[string]string{"X-Request-Id": "abc.DEF:1-2_3"}, "{}")
		for h, want := range map[string]string{"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "X-Request-Id": "abc.DEF:1-2_3"} {
			if got := r.header.Get(h); got != want {
				t.Fatalf("%s: %s = %q, want %q", path, h, got, want)
			}
		}
	}
	r := do(t, e, "POST", "/api/v1/nope", e.AdminKey, map[string]string{"X-Request-Id": "bad id with spaces"}, "{}")
	rid := r.header.Get("X-Request-Id")
	if rid == "bad id with spaces" || rid == "" {
		t.Fatalf("invalid request id echoed: %q", rid)
	}
	var eb map[string]map[string]any
	if err := json.Unmarshal(r.body, &eb); err != nil || len(eb) != 1 || len(eb["error"]) != 3 || eb["error"]["request_id"] != rid {
		t.Fatalf("error body %s", r.body)
	}
	expectCode(t, r, 404, "NOT_FOUND")
}

func TestUnexpectedErrorIsGeneric(t *testing.T) {
	db := storetest.NewTestSQLite(t)
	e := testenv.Start(t, db, testenv.Options{})
	if _, err := db.ExecContext(context.Background(), `DROP TABLE nodes`); err != nil {
		t.Fatal(err)
	}
	r := do(t, e, "POST", "/api/v1/nodes.list", e.AdminKey, nil, "{}")
	expectCode(t, r, 500, "INTERNAL_ERROR")
	if r.message() != "internal error" || strings.Contains(string(r.body), "nodes") {
		t.Fatalf("500 leaks detail: %s", r.body)
	}
}

func TestAuthentication(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		clk := clock.NewFake(time.Now())
		e := testenv.Start(t, db, testenv.Options{Clock: clk})
		ctx := context.Background()
		expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", "", nil, "{}"), 401, "UNAUTHENTICATED")
		expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", "bck_kaaaaaaaaaaaaaaaa_nope", nil, "{}"), 401, "UNAUTHENTICATED")
		expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", "", map[string]string{"Authorization": "Basic eDp5"}, "{}"), 401, "UNAUTHENTICATED")
		short, err := e.Client.CreateAPIKey(ctx, "root", "admin", "short", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", short.Key, nil, "{}"), 200, "")
		clk.Advance(2 * time.Minute)
		expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", short.Key, nil, "{}"), 401, "UNAUTHENTICATED")
		revoked, err := e.Client.CreateAPIKey(ctx, "root", "admin", "rev", 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Client.Call(ctx, "apiKeys.revoke", map[string]any{"id": revoked.ID}, nil); err != nil {
			t.Fatal(err)
		}
		expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", revoked.Key, nil, "{}"), 401, "UNAUTHENTICATED")
		// A scoped key is limited to its scopes even for an admin identity.
		scoped, err := e.Client.CreateAPIKey(ctx, "root", "admin", "ro", 0, "compute:nodes:list")
		if err != nil {
			t.Fatal(err)
		}
		expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", scoped.Key, nil, "{}"), 200, "")
		expectCode(t, do(t, e, "POST", "/api/v1/tenants.create", scoped.Key, nil, `{"name":"x"}`), 403, "ACCESS_DENIED")
		// Keys are stored only as their SHA-256 (the database is scanned for
		// the clear key in TestIdempotencyStoresNoCredential).
		var stored []byte
		if err := db.QueryRowContext(ctx, `SELECT hash FROM api_keys WHERE id = $1`, short.ID).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if sum := sha256.Sum256([]byte(short.Key)); !bytes.Equal(stored, sum[:]) {
			t.Fatalf("stored %x, not the key's SHA-256", stored)
		}
	})
}

func TestSessionCookies(t *testing.T) {
	off := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	var s struct{ Value string }
	if err := off.Client.Call(context.Background(), "sessions.create", nil, &s); err != nil {
		t.Fatal(err)
	}
	expectCode(t, do(t, off, "POST", "/api/v1/nodes.list", "", map[string]string{"Cookie": "bc_session=" + s.Value, "Origin": "https://bc.example"}, "{}"), 401, "UNAUTHENTICATED")

	on := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Tune: func(o *server.Options) {
		o.SessionCookies, o.BaseURL = true, "https://bc.example:8443/ui"
	}})
	if err := on.Client.Call(context.Background(), "sessions.create", nil, &s); err != nil {
		t.Fatal(err)
	}
	ck := "bc_session=" + s.Value
	expectCode(t, do(t, on, "POST", "/api/v1/nodes.list", "", map[string]string{"Cookie": ck}, "{}"), 403, "CSRF_REJECTED")
	expectCode(t, do(t, on, "POST", "/api/v1/nodes.list", "", map[string]string{"Cookie": ck, "Origin": "https://evil.example"}, "{}"), 403, "UNTRUSTED_ORIGIN")
	expectCode(t, do(t, on, "POST", "/api/v1/nodes.list", "", map[string]string{"Cookie": ck, "Origin": "https://bc.example"}, "{}"), 403, "UNTRUSTED_ORIGIN")
	expectCode(t, do(t, on, "POST", "/api/v1/nodes.list", "", map[string]string{"Cookie": ck, "Origin": "https://bc.example:8443"}, "{}"), 200, "")
}

// A tenant A key asking for tenant B's node gets exactly the answer it
// gets for a node that does not exist, and for a policy denial.
func TestNoExistenceOracle(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		ctx := context.Background()
		tenantA, adminA := e.TenantAdmin(t, "tenant-a")
		tenantB, _ := e.TenantAdmin(t, "tenant-b")
		if _, err := db.ExecContext(ctx, `INSERT INTO nodes (id, tenant_id, name, role, created_at) VALUES ('nbbbbbbbbbbbbbbbb', $1, 'b-node', 'node', 0)`, tenantB); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, `INSERT INTO nodes (id, tenant_id, name, role, created_at) VALUES ('naaaaaaaaaaaaaaaa', $1, 'a-node', 'node', 0)`, tenantA); err != nil {
			t.Fatal(err)
		}
		viewerA := e.IdentityClient(t, tenantA, "viewer-a", "viewer")
		keyOf := func(c *client.Client) string { return clientKey(t, c) }
		answers := map[string]reply{
			"other tenant's node":  do(t, e, "POST", "/api/v1/nodes.get", keyOf(adminA), nil, `{"id":"nbbbbbbbbbbbbbbbb"}`),
			"node that is not":     do(t, e, "POST", "/api/v1/nodes.get", keyOf(adminA), nil, `{"id":"nzzzzzzzzzzzzzzzz"}`),
			"root's node":          do(t, e, "POST", "/api/v1/nodes.get", keyOf(adminA), nil, `{"id":"`+e.Nodes[0].NodeID()+`"}`),
			"command on B's node":  do(t, e, "POST", "/api/v1/commands.create", keyOf(adminA), nil, `{"node_id":"nbbbbbbbbbbbbbbbb","kind":"node.ping"}`),
			"other tenant listing": do(t, e, "POST", "/api/v1/nodes.list", keyOf(adminA), nil, `{"tenant_id":"`+tenantB+`"}`),
			"policy denial":        do(t, e, "POST", "/api/v1/commands.create", keyOf(viewerA), nil, `{"node_id":"naaaaaaaaaaaaaaaa","kind":"node.ping"}`),
		}
		var first string
		for name, r := range answers {
			expectCode(t, r, 403, "ACCESS_DENIED")
			if first == "" {
				first = r.denialShape()
			} else if r.denialShape() != first {
				t.Fatalf("%s answers %s, others %s", name, r.denialShape(), first)
			}
		}
		// Tenant A sees its own node, and only it.
		expectCode(t, do(t, e, "POST", "/api/v1/nodes.get", keyOf(viewerA), nil, `{"id":"naaaaaaaaaaaaaaaa"}`), 200, "")
		ns, err := adminA.Nodes(ctx)
		if err != nil || len(ns) != 1 || ns[0].ID != "naaaaaaaaaaaaaaaa" {
			t.Fatalf("tenant A lists %+v (%v)", ns, err)
		}
	})
}

// TestNoExistenceOracleInAuditLog: the denial rows a tenant's own audit
// log holds for another tenant's node and for a node that does not exist
// are alike (reason out-of-reach): the log the tenant reads does not say
// which of the two its probe hit.
func TestNoExistenceOracleInAuditLog(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx := context.Background()
		tenantA, adminA := e.TenantAdmin(t, "tenant-a")
		tenantB, _ := e.TenantAdmin(t, "tenant-b")
		if _, err := db.ExecContext(ctx, `INSERT INTO nodes (id, tenant_id, name, role, created_at) VALUES ('nbbbbbbbbbbbbbbbb', $1, 'b-node', 'node', 0)`, tenantB); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"nbbbbbbbbbbbbbbbb", "nzzzzzzzzzzzzzzzz"} {
			expectCode(t, do(t, e, "POST", "/api/v1/nodes.get", clientKey(t, adminA), nil, `{"id":"`+id+`"}`), 403, "ACCESS_DENIED")
		}
		rows, err := db.QueryContext(ctx, `SELECT resource, details FROM audit_events WHERE tenant_id = $1 AND action = 'compute:nodes:get' AND outcome = 'denied' ORDER BY resource`, tenantA)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		got := map[string]string{}
		for rows.Next() {
			var res, details string
			if err := rows.Scan(&res, &details); err != nil {
				t.Fatal(err)
			}
			got[res] = details
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		want := `{"reason":"` + api.ReasonOutOfReach + `"}`
		for _, res := range []string{"node/nbbbbbbbbbbbbbbbb", "node/nzzzzzzzzzzzzzzzz"} {
			if got[res] != want {
				t.Errorf("tenant A's audit row for %s: details %q, want %q (rows %v)", res, got[res], want, got)
			}
		}
	})
}

// TestRootNamingMissingTenant: a root caller naming a tenant that does not
// exist is told NOT_FOUND (as for its missing resources), with no denial
// row; a tenant's caller naming it still gets the one denial.
func TestRootNamingMissingTenant(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		_, adminA := e.TenantAdmin(t, "tenant-a")
		for _, m := range []string{"nodes.list", "sandboxes.list", "templates.list"} {
			r := do(t, e, "POST", "/api/v1/"+m, clientKey(t, e.Client), nil, `{"tenant_id":"tnope"}`)
			expectCode(t, r, 404, "NOT_FOUND")
			if !strings.Contains(string(r.body), `"message":"tenant not found"`) {
				t.Errorf("%s: %s, want the message tenant not found", m, r.body)
			}
			expectCode(t, do(t, e, "POST", "/api/v1/"+m, clientKey(t, adminA), nil, `{"tenant_id":"tnope"}`), 403, "ACCESS_DENIED")
		}
		var n int
		if err := db.QueryRowContext(context.Background(), `SELECT COUNT(*) FROM audit_events WHERE tenant_id = 'root' AND outcome = 'denied'`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("root's denial rows: %d (%v), want none", n, err)
		}
	})
}

func clientKey(t *testing.T, c *client.Client) string {
	t.Helper()
	k := c.Key()
	if k == "" {
		t.Fatal("client has no key")
	}
	return k
}

func TestDenyBeatsAllow(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		ctx := context.Background()
		var role struct{ ID string }
		err := e.Client.Call(ctx, "roles.create", map[string]any{"tenant_id": "root", "name": "all-but-commands", "statements": []map[string]any{
			{"effect": "allow", "actions": []string{"*"}, "resources": []string{"*"}},
			{"effect": "deny", "actions": []string{"compute:commands:create"}, "resources": []string{"node/*"}},
		}}, &role)
		if err != nil {
			t.Fatal(err)
		}
		c := e.IdentityClient(t, "root", "limited", role.ID)
		if _, err := c.Nodes(ctx); err != nil {
			t.Fatalf("allowed read refused: %v", err)
		}
		if _, err := c.CreateCommand(ctx, e.Nodes[0].NodeID(), "node.ping", nil); !errors.Is(err, client.ErrAccessDenied) {
			t.Fatalf("denied action: %v, want ACCESS_DENIED", err)
		}
		none := e.IdentityClient(t, "root", "unbound", "")
		if _, err := none.Nodes(ctx); !errors.Is(err, client.ErrAccessDenied) {
			t.Fatalf("identity without bindings: %v, want ACCESS_DENIED", err)
		}
	})
}

func TestSuspendedTenant(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx := context.Background()
		tenant, admin := e.TenantAdmin(t, "acme")
		child, err := admin.CreateTenant(ctx, "", "acme-dev")
		if err != nil {
			t.Fatalf("tenant admin creates a child: %v", err)
		}
		if _, err := e.Client.SetTenantState(ctx, tenant, "suspend"); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Nodes(ctx); err != nil {
			t.Fatalf("suspended tenant's read: %v", err)
		}
		if _, err := admin.CreateTenant(ctx, "", "more"); !errors.Is(err, client.ErrTenantSuspended) {
			t.Fatalf("suspended tenant's mutation: %v, want TENANT_SUSPENDED", err)
		}
		if _, err := e.Client.CreateTenant(ctx, child.ID, "root-may"); err != nil {
			t.Fatalf("root is exempt: %v", err)
		}
		if _, err := e.Client.SetTenantState(ctx, tenant, "resume"); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.CreateTenant(ctx, "", "again"); err != nil {
			t.Fatalf("resumed tenant's mutation: %v", err)
		}
		if _, err := e.Client.SetTenantState(ctx, tenant, "delete"); err != nil {
			t.Fatal(err)
		}
		// Deleting a tenant revokes its keys (the teardown), so its callers
		// no longer authenticate at all.
		if _, err := admin.Nodes(ctx); !errors.Is(err, client.ErrUnauthenticated) {
			t.Fatalf("deleted tenant's read: %v, want UNAUTHENTICATED", err)
		}
	})
}

func TestIdempotency(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx := context.Background()
		var a, b client.Tenant
		if err := e.Client.CallIdempotent(ctx, "tenants.create", "key-1", map[string]any{"name": "once"}, &a); err != nil {
			t.Fatal(err)
		}
		if err := e.Client.CallIdempotent(ctx, "tenants.create", "key-1", map[string]any{"name": "once"}, &b); err != nil {
			t.Fatal(err)
		}
		if a.ID == "" || a != b {
			t.Fatalf("replay answered %+v, first %+v", b, a)
		}
		var n int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM tenants WHERE name = 'once'`).Scan(&n); err != nil || n != 1 {
			t.Fatalf("%d tenants made (%v), want 1", n, err)
		}
		// The stored digest is the HMAC of method and body under the key
		// derived from the KEK, not an unkeyed hash of the body.
		var digest []byte
		if err := db.QueryRowContext(ctx, `SELECT body_sha256 FROM idempotency WHERE tenant_id = 'root' AND identity_id = 'admin' AND key = 'key-1'`).Scan(&digest); err != nil {
			t.Fatal(err)
		}
		body := []byte(`{"name":"once"}`)
		mac := hmac.New(sha256.New, server.IdempotencyKey(e.KEK))
		mac.Write([]byte("tenants.create\x00"))
		mac.Write(body)
		plain, plainWithMethod := sha256.Sum256(body), sha256.Sum256(append([]byte("tenants.create\x00"), body...))
		if !hmac.Equal(digest, mac.Sum(nil)) || bytes.Equal(digest, plain[:]) || bytes.Equal(digest, plainWithMethod[:]) {
			t.Fatalf("stored digest %x is not the keyed HMAC of the request", digest)
		}
		err := e.Client.CallIdempotent(ctx, "tenants.create", "key-1", map[string]any{"name": "twice"}, &b)
		if !errors.Is(err, client.ErrConflict) {
			t.Fatalf("same key, other body: %v, want CONFLICT", err)
		}
		// Keys are scoped to (tenant, identity): another identity's key-1 is its own.
		other := e.IdentityClient(t, "root", "other-admin", "admin")
		if err := other.CallIdempotent(ctx, "tenants.create", "key-1", map[string]any{"name": "other"}, &b); err != nil || b.Name != "other" {
			t.Fatalf("other identity's key: %+v %v", b, err)
		}
	})
}

func TestRateLimited(t *testing.T) {
	clk := clock.NewFake(time.Now())
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Clock: clk, Tune: func(o *server.Options) {
		o.RateLimits = api.RateLimits{ReadPerSecond: 1, ReadBurst: 2, MutatePerSecond: 1, MutateBurst: 1}
	}})
	ok := func() reply { return do(t, e, "POST", "/api/v1/nodes.list", e.AdminKey, nil, "{}") }
	expectCode(t, ok(), 200, "")
	expectCode(t, ok(), 200, "")
	r := ok()
	expectCode(t, r, 429, "RATE_LIMITED")
	if r.header.Get("Retry-After") != "1" {
		t.Fatalf("Retry-After %q, want 1", r.header.Get("Retry-After"))
	}
	// Mutations have their own bucket.
	expectCode(t, do(t, e, "POST", "/api/v1/tenants.create", e.AdminKey, nil, `{"name":"m1"}`), 200, "")
	expectCode(t, do(t, e, "POST", "/api/v1/tenants.create", e.AdminKey, nil, `{"name":"m2"}`), 429, "RATE_LIMITED")
	clk.Advance(time.Second)
	expectCode(t, ok(), 200, "")
}

func TestCallerAddressAndAudit(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		proxies, _ := api.ParseProxies([]string{"10.9.9.9"})
		e := testenv.Start(t, db, testenv.Options{Tune: func(o *server.Options) { o.TrustedProxies = proxies }})
		ctx := context.Background()
		r := do(t, e, "POST", "/api/v1/tenants.create", e.AdminKey, map[string]string{"X-Forwarded-For": "203.0.113.7", "X-Request-Id": "req-spoof"}, `{"name":"spoofed"}`)
		expectCode(t, r, 200, "")
		var actor, tenant, action, resource, outcome, rid, caller string
		err := db.QueryRowContext(ctx, `SELECT actor, tenant_id, action, resource, outcome, request_id, caller FROM audit_events WHERE request_id = 'req-spoof'`).
			Scan(&actor, &tenant, &action, &resource, &outcome, &rid, &caller)
		if err != nil {
			t.Fatal(err)
		}
		if caller != "127.0.0.1" || actor != "admin" || tenant != "root" || action != "compute:tenants:create" || !strings.HasPrefix(resource, "tenant/t") || outcome != "allowed" {
			t.Fatalf("audit row: %s %s %s %s %s caller=%q", actor, tenant, action, resource, outcome, caller)
		}
		// A denial is audited too.
		viewer := e.IdentityClient(t, "root", "v", "viewer")
		rr := do(t, e, "POST", "/api/v1/tenants.create", clientKey(t, viewer), map[string]string{"X-Request-Id": "req-denied"}, `{"name":"nope"}`)
		expectCode(t, rr, 403, "ACCESS_DENIED")
		if err := db.QueryRowContext(ctx, `SELECT outcome FROM audit_events WHERE request_id = 'req-denied'`).Scan(&outcome); err != nil || outcome != "denied" {
			t.Fatalf("denial audit: %q %v", outcome, err)
		}
	})
}

func TestWellKnownAndHealth(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	r := do(t, e, "GET", "/.well-known/better-compute", "", nil, "")
	if r.status != 200 {
		t.Fatalf("well-known: %d", r.status)
	}
	var doc struct {
		TrustDomain string `json:"trust_domain"`
		Keys        struct {
			Keys []map[string]any `json:"keys"`
		} `json:"keys"`
	}
	if err := json.Unmarshal(r.body, &doc); err != nil || doc.TrustDomain != e.Bundle.TrustDomain || len(doc.Keys.Keys) != 3 {
		t.Fatalf("well-known: %s (%v)", r.body, err)
	}
	for _, k := range doc.Keys.Keys {
		if _, ok := k["d"]; ok {
			t.Fatal("a private member is served")
		}
		if k["kty"] != "OKP" || k["crv"] != "Ed25519" {
			t.Fatalf("key %v", k)
		}
	}
	if r := do(t, e, "GET", "/healthz", "", nil, ""); r.status != 200 || !bytes.Contains(r.body, []byte("ok")) {
		t.Fatalf("healthz: %d %s", r.status, r.body)
	}
}

// Metrics (per-method counts of every tenant) are served only on their
// own listener, never on the API's: there /metrics is NOT_FOUND, with or
// without credentials.
func TestMetricsOnOwnListener(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Tune: func(o *server.Options) { o.MetricsListen = "127.0.0.1:0" }})
	expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", e.AdminKey, nil, "{}"), 200, "")
	for _, key := range []string{"", e.AdminKey} {
		r := do(t, e, "GET", "/metrics", key, nil, "")
		expectCode(t, r, 404, "NOT_FOUND")
		if bytes.Contains(r.body, []byte("bc_api_requests_total")) {
			t.Fatalf("metrics on the API listener: %s", r.body)
		}
	}
	if e.CP.MetricsAddr == "" || e.CP.MetricsAddr == e.CP.APIAddr {
		t.Fatalf("metrics address %q (API %q)", e.CP.MetricsAddr, e.CP.APIAddr)
	}
	get := func(path string) (int, http.Header, []byte) {
		resp, err := http.Get("http://" + e.CP.MetricsAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, b
	}
	status, hdr, body := get("/metrics")
	if status != 200 || !bytes.Contains(body, []byte(`bc_api_requests_total{code="200",method="nodes.list"}`)) || hdr.Get("Cache-Control") != "no-store" {
		t.Fatalf("metrics listener: %d %s", status, body)
	}
	if status, _, body := get("/api/v1/nodes.list"); status != 404 || !bytes.Contains(body, []byte(`"NOT_FOUND"`)) {
		t.Fatalf("the metrics listener serves the API: %d %s", status, body)
	}
	// Without MetricsListen there is no metrics listener at all.
	plain := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	if plain.CP.MetricsAddr != "" {
		t.Fatalf("metrics listener without MetricsListen: %s", plain.CP.MetricsAddr)
	}
}

// Every answer, on any path, comes through the envelope: the JSON error
// shape, the security headers, no redirect, no plain text.
func TestEveryPathAnswersThroughEnvelope(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	cases := []struct {
		method, path, key string
		status            int
		code              string
	}{
		{"POST", "/api/v1/../v1/nodes.list", e.AdminKey, 404, "NOT_FOUND"},
		{"POST", "/api/v1/./nodes.list", e.AdminKey, 404, "NOT_FOUND"},
		{"POST", "/api/v1//nodes.list", e.AdminKey, 404, "NOT_FOUND"},
		{"POST", "/api/v2/x", e.AdminKey, 404, "NOT_FOUND"},
		{"POST", "/api/", e.AdminKey, 404, "NOT_FOUND"},
		{"POST", "/api/v2/x", "", 401, "UNAUTHENTICATED"},
		{"GET", "/api/v2/x", "", 403, "CSRF_REJECTED"},
		{"POST", "/healthz", "", 405, "INVALID_INPUT"},
		{"POST", "/.well-known/better-compute", "", 405, "INVALID_INPUT"},
		{"GET", "/nope", "", 404, "NOT_FOUND"},
		{"GET", "/", "", 404, "NOT_FOUND"},
		{"GET", "/healthz/../metrics", "", 404, "NOT_FOUND"},
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, c := range cases {
		req, err := http.NewRequest(c.method, "http://"+e.CP.APIAddr+c.path, strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Better-Compute", "1")
		if c.key != "" {
			req.Header.Set("Authorization", "Bearer "+c.key)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		r := reply{status: resp.StatusCode, header: resp.Header, body: b}
		if r.status != c.status || r.code() != c.code {
			t.Errorf("%s %s: %d %s (%s), want %d %s", c.method, c.path, r.status, r.code(), b, c.status, c.code)
			continue
		}
		var eb map[string]map[string]any
		if err := json.Unmarshal(b, &eb); err != nil || len(eb["error"]) != 3 {
			t.Errorf("%s %s: not the error shape: %s", c.method, c.path, b)
		}
		for h, want := range map[string]string{"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Content-Type": "application/json"} {
			if got := r.header.Get(h); got != want {
				t.Errorf("%s %s: %s = %q, want %q", c.method, c.path, h, got, want)
			}
		}
	}
}

// OPTIONS * (which net/http answers by itself unless told not to) goes
// through the envelope too (the metrics listener is built the same way).
func TestOptionsStarThroughEnvelope(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	for _, addr := range []string{e.CP.APIAddr} {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if _, err := conn.Write([]byte("OPTIONS * HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		r := reply{status: resp.StatusCode, header: resp.Header, body: b}
		if r.status < 400 || r.code() == "" || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Fatalf("OPTIONS * on %s: %d %q %v, want an envelope error", addr, r.status, b, resp.Header)
		}
	}
}

// An unauthenticated caller learns nothing about methods or their inputs:
// an unknown method, a known one, and a known one with a malformed body
// answer the same 401, byte for byte but the request id.
func TestAuthenticateBeforeLookupAndDecode(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	var first string
	for _, key := range []string{"", "bck_kaaaaaaaaaaaaaaaa_nope"} {
		for _, c := range []struct{ path, body string }{
			{"/api/v1/nodes.list", "{}"},
			{"/api/v1/no.such", "{}"},
			{"/api/v1/tenants.create", `{"name":7,"colour":1}`},
			{"/api/v1/tenants.create", `not json`},
		} {
			r := do(t, e, "POST", c.path, key, nil, c.body)
			expectCode(t, r, 401, "UNAUTHENTICATED")
			if first == "" {
				first = r.withoutRequestID()
			} else if r.withoutRequestID() != first {
				t.Fatalf("%s %s answers %s, others %s", c.path, c.body, r.withoutRequestID(), first)
			}
		}
	}
}

// Failed authentications are limited per caller address (RATE_LIMITED
// with Retry-After, whatever the key then presented); calls with
// malformed bodies and calls the pre-check refuses spend the caller's
// tokens like any other.
func TestFailedAuthAndRefusalsAreRateLimited(t *testing.T) {
	clk := clock.NewFake(time.Now())
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Clock: clk, Tune: func(o *server.Options) {
		o.RateLimits = api.RateLimits{ReadPerSecond: 1, ReadBurst: 2, MutatePerSecond: 1, MutateBurst: 20, FailedAuthPerSecond: 1, FailedAuthBurst: 3}
	}})
	_, adminA := e.TenantAdmin(t, "rl-a")
	tenantB, _ := e.TenantAdmin(t, "rl-b")
	keyA := clientKey(t, adminA)
	for i := 0; i < 3; i++ {
		expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", "bck_kaaaaaaaaaaaaaaaa_nope", nil, "{}"), 401, "UNAUTHENTICATED")
	}
	for _, key := range []string{"bck_kaaaaaaaaaaaaaaaa_nope", "", e.AdminKey} {
		r := do(t, e, "POST", "/api/v1/nodes.list", key, nil, "{}")
		expectCode(t, r, 429, "RATE_LIMITED")
		if r.header.Get("Retry-After") != "1" {
			t.Fatalf("Retry-After %q, want 1", r.header.Get("Retry-After"))
		}
	}
	clk.Advance(time.Second)
	expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", e.AdminKey, nil, "{}"), 200, "")
	expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", "bck_kaaaaaaaaaaaaaaaa_nope", nil, "{}"), 401, "UNAUTHENTICATED")
	expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", "bck_kaaaaaaaaaaaaaaaa_nope", nil, "{}"), 429, "RATE_LIMITED")

	// Malformed bodies reach the identity's limiter.
	clk.Advance(time.Minute)
	expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", e.AdminKey, nil, `{"colour":1}`), 400, "INVALID_INPUT")
	expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", e.AdminKey, nil, `[]`), 400, "INVALID_INPUT")
	expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", e.AdminKey, nil, `{"colour":1}`), 429, "RATE_LIMITED")

	// So do calls the tenant pre-check refuses.
	clk.Advance(time.Minute)
	for i := 0; i < 2; i++ {
		expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", keyA, nil, `{"tenant_id":"`+tenantB+`"}`), 403, "ACCESS_DENIED")
	}
	expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", keyA, nil, `{"tenant_id":"`+tenantB+`"}`), 429, "RATE_LIMITED")
}

// The pre-check denies a call outside the caller's tenant after
// authentication with no IAM, policy or resource read: with every table
// gone but the ones authentication reads (api_keys, sessions,
// identities), the tenant tree (tenants, which a pre-check that lets a
// parent act in its subtree reads) and the audit table its denial row goes
// to, the call still answers ACCESS_DENIED and leaves one denial row in
// the caller's own tenant, while a call that passes the pre-check (and so
// reads roles and bindings) fails.
func TestTenantPrecheckReadsNothing(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx := context.Background()
		tenantA, adminA := e.TenantAdmin(t, "pre-a")
		tenantB, _ := e.TenantAdmin(t, "pre-b")
		keep := map[string]bool{"api_keys": true, "sessions": true, "identities": true, "tenants": true, "audit_events": true, "schema_migrations": true}
		list := `SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'`
		drop := `DROP TABLE %q`
		if db.Dialect == store.Postgres {
			list, drop = `SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()`, `DROP TABLE %q CASCADE`
		}
		rows, err := db.QueryContext(ctx, list)
		if err != nil {
			t.Fatal(err)
		}
		var tables []string
		for rows.Next() {
			var n string
			if err := rows.Scan(&n); err != nil {
				t.Fatal(err)
			}
			if !keep[n] {
				tables = append(tables, n)
			}
		}
		rows.Close()
		if len(tables) < 20 {
			t.Fatalf("only %d tables to drop: %v", len(tables), tables)
		}
		if db.Dialect == store.SQLite {
			if _, err := db.ExecContext(ctx, `PRAGMA foreign_keys = OFF`); err != nil {
				t.Fatal(err)
			}
		}
		for _, n := range tables {
			if _, err := db.ExecContext(ctx, fmt.Sprintf(drop, n)); err != nil {
				t.Fatalf("drop %s: %v", n, err)
			}
		}
		r := do(t, e, "POST", "/api/v1/nodes.list", clientKey(t, adminA), map[string]string{"X-Request-Id": "pre-denied"}, `{"tenant_id":"`+tenantB+`"}`)
		expectCode(t, r, 403, "ACCESS_DENIED")
		var tenant, outcome, details string
		if err := db.QueryRowContext(ctx, `SELECT tenant_id, outcome, details FROM audit_events WHERE request_id = 'pre-denied'`).Scan(&tenant, &outcome, &details); err != nil {
			t.Fatal(err)
		}
		if tenant != tenantA || outcome != "denied" || !strings.Contains(details, "tenant-precheck") {
			t.Fatalf("denial row: tenant %s (caller %s) %s %s", tenant, tenantA, outcome, details)
		}
		expectCode(t, do(t, e, "POST", "/api/v1/nodes.list", clientKey(t, adminA), nil, `{}`), 500, "INTERNAL_ERROR")
	})
}

// shownOnceMessage is the CONFLICT message of a replayed credential answer.
const shownOnceMessage = "a request with this Idempotency-Key already ran; its answer carried a credential, which is shown once and not replayed"

// No credential is stored in clear anywhere in the database: one of each
// (API key, join token, join tokens from createMany, session) is minted
// with an Idempotency-Key, its replay answers CONFLICT instead of showing
// it again, and the secret part of none appears in the raw database file
// (SQLite, with its WAL) or in any column of any table (PostgreSQL).
func TestIdempotencyStoresNoCredential(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		var secrets []string
		// The secret is what follows the prefix and id: bck_<id>_<secret>,
		// bcs_<id>_<secret>, bcj1.<pin>.<id>.<secret>.
		part := func(s, sep string, n int) string {
			p := strings.SplitN(s, sep, n)
			return p[len(p)-1]
		}
		calls := []struct{ method, body string }{
			{"apiKeys.create", `{"tenant_id":"root","identity_id":"admin","name":"minted"}`},
			{"joinTokens.create", `{"name":"one"}`},
			{"joinTokens.createMany", `{"count":3}`},
			{"sessions.create", `{}`},
		}
		for i, c := range calls {
			hdr := map[string]string{"Idempotency-Key": fmt.Sprintf("cred-%d", i)}
			r := do(t, e, "POST", "/api/v1/"+c.method, e.AdminKey, hdr, c.body)
			expectCode(t, r, 200, "")
			var out struct {
				Key    string `json:"key"`
				Token  string `json:"token"`
				Value  string `json:"value"`
				Tokens []struct {
					Token string `json:"token"`
				} `json:"tokens"`
			}
			if err := json.Unmarshal(r.body, &out); err != nil {
				t.Fatal(err)
			}
			switch c.method {
			case "apiKeys.create":
				secrets = append(secrets, out.Key, part(out.Key, "_", 3))
			case "joinTokens.create":
				secrets = append(secrets, out.Token, part(out.Token, ".", 4))
			case "joinTokens.createMany":
				if len(out.Tokens) != 3 {
					t.Fatalf("createMany: %s", r.body)
				}
				for _, tk := range out.Tokens {
					secrets = append(secrets, tk.Token, part(tk.Token, ".", 4))
				}
			case "sessions.create":
				secrets = append(secrets, out.Value, part(out.Value, "_", 3))
			}
			again := do(t, e, "POST", "/api/v1/"+c.method, e.AdminKey, hdr, c.body)
			expectCode(t, again, 409, "CONFLICT")
			if again.message() != shownOnceMessage {
				t.Fatalf("%s replay: %q", c.method, again.message())
			}
		}
		for _, s := range secrets {
			if len(s) < 16 {
				t.Fatalf("secret part %q too short to search for", s)
			}
		}
		for _, where := range scanDatabase(t, db, secrets) {
			t.Errorf("a credential is stored in clear: %s", where)
		}
	})
}

// scanDatabase returns where any of needles appears in db: in the SQLite
// file and its WAL, or in any column of any table of the PostgreSQL schema.
func scanDatabase(t *testing.T, db *store.DB, needles []string) []string {
	t.Helper()
	ctx := context.Background()
	var found []string
	if db.Dialect == store.SQLite {
		var seq int
		var name, file string
		if err := db.QueryRowContext(ctx, `PRAGMA database_list`).Scan(&seq, &name, &file); err != nil || file == "" {
			t.Fatalf("sqlite file: %q %v", file, err)
		}
		read := 0
		for _, f := range []string{file, file + "-wal", file + "-journal"} {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			read++
			for _, n := range needles {
				if bytes.Contains(b, []byte(n)) {
					found = append(found, f+": "+n)
				}
			}
		}
		if read == 0 {
			t.Fatal("no database file read")
		}
		return found
	}
	rows, err := db.QueryContext(ctx, `SELECT table_name, column_name, data_type FROM information_schema.columns WHERE table_schema = current_schema()`)
	if err != nil {
		t.Fatal(err)
	}
	type col struct{ table, column, typ string }
	var cols []col
	for rows.Next() {
		var c col
		if err := rows.Scan(&c.table, &c.column, &c.typ); err != nil {
			t.Fatal(err)
		}
		cols = append(cols, c)
	}
	rows.Close()
	if len(cols) < 20 {
		t.Fatalf("only %d columns found", len(cols))
	}
	for _, c := range cols {
		expr := fmt.Sprintf(`CAST(%q AS TEXT)`, c.column)
		if c.typ == "bytea" {
			expr = fmt.Sprintf(`encode(%q, 'escape')`, c.column)
		}
		rs, err := db.QueryContext(ctx, fmt.Sprintf(`SELECT %s FROM %q WHERE %q IS NOT NULL`, expr, c.table, c.column))
		if err != nil {
			t.Fatalf("%s.%s: %v", c.table, c.column, err)
		}
		for rs.Next() {
			var v string
			if err := rs.Scan(&v); err != nil {
				t.Fatal(err)
			}
			for _, n := range needles {
				if strings.Contains(v, n) {
					found = append(found, c.table+"."+c.column+": "+n)
				}
			}
		}
		rs.Close()
	}
	return found
}

// Idempotency keys expire after 24 hours (a key that old is new again, and
// the sweep deletes it), and a key held by a request whose process died is
// released when its lease runs out, then runs once.
func TestIdempotencyExpiresAndReleases(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		clk := clock.NewFake(time.Now())
		e := testenv.Start(t, db, testenv.Options{Clock: clk})
		ctx := context.Background()
		hdr := map[string]string{"Idempotency-Key": "k-exp"}
		expectCode(t, do(t, e, "POST", "/api/v1/tenants.create", e.AdminKey, hdr, `{"name":"exp-1"}`), 200, "")
		expectCode(t, do(t, e, "POST", "/api/v1/tenants.create", e.AdminKey, hdr, `{"name":"exp-2"}`), 409, "CONFLICT")
		clk.Advance(idempotency.TTL)
		expectCode(t, do(t, e, "POST", "/api/v1/tenants.create", e.AdminKey, hdr, `{"name":"exp-2"}`), 200, "")

		// A request that stored its key and died: its row is in progress.
		body := `{"name":"stuck"}`
		mac := hmac.New(sha256.New, server.IdempotencyKey(e.KEK))
		mac.Write([]byte("tenants.create\x00" + body))
		now := clk.Now()
		if _, err := db.ExecContext(ctx, `INSERT INTO idempotency (tenant_id, identity_id, key, method, body_sha256, status, created_at, lease_expires_at) VALUES ('root', 'admin', 'k-stuck', 'tenants.create', $1, 0, $2, $3)`,
			mac.Sum(nil), now.UnixMilli(), now.Add(2*time.Minute).UnixMilli()); err != nil {
			t.Fatal(err)
		}
		stuck := map[string]string{"Idempotency-Key": "k-stuck"}
		r := do(t, e, "POST", "/api/v1/tenants.create", e.AdminKey, stuck, body)
		expectCode(t, r, 409, "CONFLICT")
		if r.message() != "a request with this Idempotency-Key is still running" {
			t.Fatalf("in progress: %q", r.message())
		}
		clk.Advance(2 * time.Minute)
		first := do(t, e, "POST", "/api/v1/tenants.create", e.AdminKey, stuck, body)
		expectCode(t, first, 200, "")
		replay := do(t, e, "POST", "/api/v1/tenants.create", e.AdminKey, stuck, body)
		if replay.status != 200 || string(replay.body) != string(first.body) {
			t.Fatalf("replay after takeover: %d %s, first %s", replay.status, replay.body, first.body)
		}
		var n int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM tenants WHERE name = 'stuck'`).Scan(&n); err != nil || n != 1 {
			t.Fatalf("%d tenants made (%v), want 1", n, err)
		}

		swept, err := idempotency.Sweep(ctx, db, clk.Now().Add(idempotency.TTL))
		if err != nil || swept != 2 {
			t.Fatalf("swept %d (%v), want 2", swept, err)
		}
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM idempotency`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("%d idempotency rows left (%v)", n, err)
		}
	})
}

// Errors name fields by their JSON path, never by a Go type.
func TestErrorsNameJSONPaths(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	cases := []struct{ method, body, msg string }{
		{"templates.create", `{"warm":"x"}`, `field "warm": wrong type`},
		{"templates.create", `{"limits":{"cpu_millis":"x"}}`, `field "limits.cpu_millis": wrong type`},
		{"templates.create", `{"limits":{"CPU_millis":1}}`, `unknown field "limits.CPU_millis"`},
		{"nodes.list", `{"tenant_id":1}`, `field "tenant_id": wrong type`},
		{"roles.create", `{"name":"r","statements":[{"effect":1}]}`, `field "statements[0].effect": wrong type`},
		{"roles.create", `{"name":"r","statements":[{"effect":"allow","Actions":[]}]}`, `unknown field "statements[0].Actions"`},
		{"templates.create", `{"env":{"K":7}}`, `field "env.K": wrong type`},
	}
	for _, c := range cases {
		r := do(t, e, "POST", "/api/v1/"+c.method, e.AdminKey, nil, c.body)
		expectCode(t, r, 400, "INVALID_INPUT")
		if r.message() != c.msg {
			t.Errorf("%s %s: %q, want %q", c.method, c.body, r.message(), c.msg)
		}
		for _, goName := range []string{"TemplateIn", "tenantIn", "Statement", "Limits"} {
			if strings.Contains(r.message(), goName) {
				t.Errorf("%s: message names a Go type: %q", c.method, r.message())
			}
		}
	}
}

// Every string, list and number of every method's input has a bound (the
// walk finds none without), and a string past its cap is refused.
func TestInputsAreBounded(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	ms := e.CP.API.Methods()
	if len(ms) < 40 {
		t.Fatalf("only %d methods registered", len(ms))
	}
	for _, m := range ms {
		if m.Input() == nil {
			t.Errorf("%s: no input type", m.Name)
			continue
		}
		for _, p := range api.LimitProblems(m.Input()) {
			t.Errorf("%s: %s", m.Name, p)
		}
	}
	long := strings.Repeat("n", 60000)
	r := do(t, e, "POST", "/api/v1/apiKeys.create", e.AdminKey, nil, `{"tenant_id":"root","identity_id":"admin","name":"`+long+`"}`)
	expectCode(t, r, 400, "INVALID_INPUT")
	if r.message() != `field "name": at most 128 bytes` {
		t.Fatalf("long name: %q", r.message())
	}
	var n int
	if err := e.CP.DB.QueryRowContext(context.Background(), `SELECT COUNT(*) FROM api_keys WHERE LENGTH(name) > 128`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d long names stored (%v)", n, err)
	}
	r = do(t, e, "POST", "/api/v1/roles.create", e.AdminKey, nil, `{"name":"r","statements":[{"effect":"allow","actions":["`+strings.Repeat("a", 129)+`"]}]}`)
	if r.message() != `field "statements[0].actions[0]": at most 128 bytes` {
		t.Fatalf("long action: %q", r.message())
	}
}

// Every integer input has a range, and a value outside it is refused the
// same way on every method: INVALID_INPUT naming the field and the range.
// The edges themselves decode; one past either edge, negatives where the
// range starts at 0, and the values that once overflowed a duration
// (18446744074, 2^63-1, 2^64) do not.
func TestNumericRanges(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	checked := 0
	for _, m := range e.CP.API.Methods() {
		for _, nb := range api.NumberBounds(m.Input()) {
			checked++
			path := strings.Join(nb.Path, ".")
			body := func(v string) string {
				b := v
				for i := len(nb.Path) - 1; i >= 0; i-- {
					b = fmt.Sprintf(`{%q:%s}`, nb.Path[i], b)
				}
				return b
			}
			for _, v := range []int64{nb.Min, nb.Max} {
				in := reflect.New(m.Input()).Interface()
				if err := api.Decode([]byte(body(fmt.Sprint(v))), in); err != nil {
					t.Errorf("%s %s=%d: %v", m.Name, path, v, err)
				}
			}
			want := fmt.Sprintf("field %q: an integer from %d to %d", path, nb.Min, nb.Max)
			outside := []string{"1.5", "1e3"}
			lo, hi := big.NewInt(nb.Min), big.NewInt(nb.Max)
			for _, v := range []string{"-1", "18446744074", "9223372036854775807", "18446744073709551616", "-9223372036854775809",
				new(big.Int).Sub(lo, big.NewInt(1)).String(), new(big.Int).Add(hi, big.NewInt(1)).String()} {
				n, _ := new(big.Int).SetString(v, 10)
				if n.Cmp(lo) < 0 || n.Cmp(hi) > 0 {
					outside = append(outside, v)
				}
			}
			for _, v := range outside {
				r := do(t, e, "POST", "/api/v1/"+m.Name, e.AdminKey, nil, body(v))
				if r.status != 400 || r.code() != "INVALID_INPUT" || r.message() != want {
					t.Errorf("%s %s=%s: %d %s %q, want INVALID_INPUT %q", m.Name, path, v, r.status, r.code(), r.message(), want)
				}
			}
		}
	}
	if checked < 15 {
		t.Fatalf("only %d numeric fields found", checked)
	}
}

// Every allowed mutation writes an audit row: the test walks the method
// table and calls every method marked Mutates, as root's admin with valid
// input, and finds an allowed row carrying that call's request id. A
// mutating method the walk has no call for fails the test.
func TestEveryMutationIsAudited(t *testing.T) {
	storetest.ForEachDialect(t, everyMutationIsAudited)
}

func everyMutationIsAudited(t *testing.T, db *store.DB) {
	e := testenv.Start(t, db, testenv.Options{Nodes: 1, SandboxRuntime: "sim"})
	ctx := context.Background()
	node := e.Nodes[0].NodeID()
	var serial string
	if err := e.CP.DB.QueryRowContext(ctx, `SELECT serial FROM node_certs WHERE node_id = $1 ORDER BY not_after DESC LIMIT 1`, node).Scan(&serial); err != nil {
		t.Fatal(err)
	}
	// A node that never connects: a command to it stays queued (cancellable).
	offline := "nwalkofflinexxxxx"
	if _, err := e.CP.DB.ExecContext(ctx, `INSERT INTO nodes (id, tenant_id, name, role, created_at) VALUES ($1, 'root', 'walk-offline', 'node', 0)`, offline); err != nil {
		t.Fatal(err)
	}
	// A bastion (a node of role bastion) for the bastions methods.
	bastion := "nwalkbastionxxxx"
	if _, err := e.CP.DB.ExecContext(ctx, `INSERT INTO nodes (id, tenant_id, name, role, created_at) VALUES ($1, 'root', 'walk-bastion', 'bastion', 0)`, bastion); err != nil {
		t.Fatal(err)
	}
	// bastions.op reaches a stand-in for the bastion's ops server.
	e.CP.Bastions.SetOpsDialer(opstest.Start(t))
	var tarball bytes.Buffer
	tw := tar.NewWriter(&tarball)
	_ = tw.WriteHeader(&tar.Header{Name: "hello", Mode: 0o644, Size: 2})
	_, _ = tw.Write([]byte("hi"))
	_ = tw.Close()
	digest := sha256.Sum256(tarball.Bytes())
	newKey := func() []byte {
		pub, _, _ := ed25519.GenerateKey(nil)
		return pub
	}

	var state = map[string]string{}
	call := func(t *testing.T, method, body string) map[string]any {
		t.Helper()
		rid := "audit-walk-" + strings.ReplaceAll(method, ".", "-")
		r := do(t, e, "POST", "/api/v1/"+method, e.AdminKey, map[string]string{"X-Request-Id": rid}, body)
		expectCode(t, r, 200, "")
		var n int
		if err := e.CP.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit_events WHERE request_id = $1 AND outcome = 'allowed'`, rid).Scan(&n); err != nil || n < 1 {
			t.Errorf("%s wrote no audit row (%d, %v)", method, n, err)
		}
		var out map[string]any
		_ = json.Unmarshal(r.body, &out)
		return out
	}
	str := func(v any) string { s, _ := v.(string); return s }
	steps := []struct {
		method string
		body   func() string
		keep   func(map[string]any)
	}{
		{"tenants.create", func() string { return `{"name":"audit-walk"}` }, func(o map[string]any) { state["tenant"] = str(o["id"]) }},
		{"tenants.suspend", func() string { return `{"id":"` + state["tenant"] + `"}` }, nil},
		{"tenants.resume", func() string { return `{"id":"` + state["tenant"] + `"}` }, nil},
		{"tenants.setQuotas", func() string { return `{"id":"` + state["tenant"] + `","limits":{"sandboxes":5}}` }, nil},
		{"identities.create", func() string { return `{"name":"walker","kind":"agent"}` }, func(o map[string]any) { state["identity"] = str(o["id"]) }},
		{"roles.create", func() string {
			return `{"name":"walker","statements":[{"effect":"allow","actions":["compute:nodes:list"],"resources":["*"]}]}`
		}, func(o map[string]any) { state["role"] = str(o["id"]) }},
		{"bindings.create", func() string { return `{"identity_id":"` + state["identity"] + `","role_id":"` + state["role"] + `"}` }, func(o map[string]any) { state["binding"] = str(o["id"]) }},
		{"bindings.delete", func() string { return `{"id":"` + state["binding"] + `"}` }, nil},
		{"identities.suspend", func() string { return `{"id":"` + state["identity"] + `"}` }, nil},
		{"identities.resume", func() string { return `{"id":"` + state["identity"] + `"}` }, nil},
		{"identities.delete", func() string { return `{"id":"` + state["identity"] + `"}` }, nil},
		{"roles.delete", func() string { return `{"id":"` + state["role"] + `"}` }, nil},
		{"apiKeys.create", func() string { return `{"identity_id":"admin","name":"walk"}` }, func(o map[string]any) { state["key"] = str(o["id"]) }},
		{"apiKeys.revoke", func() string { return `{"id":"` + state["key"] + `"}` }, nil},
		{"sessions.create", func() string { return `{}` }, func(o map[string]any) { state["session"] = str(o["id"]) }},
		{"sessions.revoke", func() string { return `{"id":"` + state["session"] + `"}` }, nil},
		{"approvals.setKinds", func() string { return `{"kinds":["disk.wipe"]}` }, nil},
		{"approvals.approve", func() string {
			state["agent"], state["held"], state["held2"] = heldForAdmin(t, e, node)
			return `{"id":"` + state["held"] + `"}`
		}, nil},
		{"approvals.deny", func() string { return `{"id":"` + state["held2"] + `"}` }, nil},
		{"delegations.revoke", func() string { return `{"id":"` + state["agent"] + `"}` }, nil},
		{"joinTokens.create", func() string { return `{}` }, func(o map[string]any) { state["join-token"] = str(o["id"]) }},
		{"joinTokens.revoke", func() string { return `{"id":"` + state["join-token"] + `"}` }, nil},
		{"joinTokens.createMany", func() string { return `{"count":2}` }, nil},
		{"secrets.put", func() string { return `{"name":"walk","value_base64":"aGk="}` }, func(o map[string]any) { state["secret"] = str(o["ref"]) }},
		{"secrets.delete", func() string { return `{"ref":"` + state["secret"] + `"}` }, nil},
		{"commands.create", func() string { return `{"node_id":"` + offline + `","kind":"node.ping"}` }, func(o map[string]any) { state["command"] = str(o["id"]) }},
		{"commands.cancel", func() string { return `{"id":"` + state["command"] + `"}` }, nil},
		{"commands.fanout", func() string { return `{"node_ids":["` + node + `"],"kind":"node.ping"}` }, nil},
		{"batches.create", func() string { return `{"leaves":[{"node_id":"` + node + `","kind":"node.reboot"}]}` }, func(o map[string]any) {
			state["batch"], state["root"], state["deployment"] = str(o["id"]), str(o["root"]), str(o["deployment"])
			state["expires"] = fmt.Sprint(int64(o["expires_at_ms"].(float64)))
		}},
		{"batches.approve", func() string {
			root, _ := hex.DecodeString(state["root"])
			var exp int64
			fmt.Sscan(state["expires"], &exp)
			k := e.ApproverKeys[0]
			sig := ed25519.Sign(k, quorumwire.ApprovalMessage(state["deployment"], state["batch"], root, exp))
			b, _ := json.Marshal(map[string]any{"id": state["batch"], "approver_key": []byte(k.Public().(ed25519.PublicKey)), "signature": sig})
			return string(b)
		}, nil},
		{"commands.createInBatch", func() string {
			return `{"node_id":"` + node + `","kind":"node.reboot","batch_id":"` + state["batch"] + `"}`
		}, nil},
		{"approvers.sign", func() string {
			set, err := quorumwire.NewApproverSet(1, 1, [][]byte{newKey()})
			if err != nil {
				t.Fatal(err)
			}
			k := e.ApproverKeys[0]
			sig := ed25519.Sign(k, quorumwire.ApproverSetMessage(e.Bundle.Deployment, set))
			b, _ := json.Marshal(map[string]any{"generation": 1, "threshold": 1, "keys": set.RawKeys(), "approver_key": []byte(k.Public().(ed25519.PublicKey)), "signature": sig})
			return string(b)
		}, nil},
		{"images.beginUpload", func() string { return `{}` }, func(o map[string]any) {
			state["upload"] = str(o["upload_id"])
			// The bytes stream through the upload endpoint (uploads_test.go).
			r := do(t, e, "PUT", "/api/v1/uploads/"+state["upload"], e.AdminKey,
				map[string]string{"Content-Type": "application/octet-stream", "Upload-Offset": "0"}, tarball.String())
			expectCode(t, r, 200, "")
		}},
		{"images.import", func() string {
			return `{"upload_id":"` + state["upload"] + `","name":"walk","digest":"sha256:` + hex.EncodeToString(digest[:]) + `"}`
		}, nil},
		{"templates.create", func() string { return `{"name":"walk","image":"walk","runtime":"sim"}` }, func(o map[string]any) { state["template"] = str(o["id"]) }},
		{"templates.update", func() string {
			return `{"id":"` + state["template"] + `","image":"walk","runtime":"sim","lifetime_seconds":600}`
		}, nil},
		{"sandboxes.create", func() string { return `{"template":"walk"}` }, func(o map[string]any) { state["sandbox"] = str(o["id"]) }},
		{"sandboxes.exec", func() string { return `{"id":"` + state["sandbox"] + `","argv":["echo","hi"],"timeout_seconds":10}` }, nil},
		{"sandboxes.checkpoint", func() string { return `{"id":"` + state["sandbox"] + `"}` }, func(o map[string]any) { state["checkpoint"] = str(o["id"]) }},
		{"sandboxes.execTicket", func() string { return `{"id":"` + state["sandbox"] + `","argv":["sh"]}` }, nil},
		{"sandboxes.preview", func() string { return `{"id":"` + state["sandbox"] + `","port":8080}` }, nil},
		{"previews.rotateKey", func() string { return `{}` }, nil},
		{"sandboxes.extend", func() string { return `{"id":"` + state["sandbox"] + `","seconds":60}` }, nil},
		{"sandboxes.delete", func() string { return `{"id":"` + state["sandbox"] + `"}` }, nil},
		{"checkpoints.delete", func() string { return `{"id":"` + state["checkpoint"] + `"}` }, nil},
		{"templates.delete", func() string { return `{"id":"` + state["template"] + `"}` }, nil},
		{"images.delete", func() string { return `{"name":"walk"}` }, nil},
		{"tunnels.open", func() string { return `{"node_id":"` + node + `","port":22}` }, nil},
		{"nodes.issueSshCert", func() string {
			return `{"node_id":"` + node + `","account":"root","public_key":"` + sshPublicKeyLine(t) + `"}`
		}, func(o map[string]any) { state["ssh-serial"] = str(o["serial"]) }},
		{"nodes.revokeSshCert", func() string { return `{"node_id":"` + node + `","serial":"` + state["ssh-serial"] + `"}` }, nil},
		{"nodes.restrict", func() string {
			return `{"node_id":"` + node + `","serial":"` + serial + `","allowed_kinds":["node.ping"]}`
		}, nil},
		{"bastions.pairToken", func() string { return `{"name":"walk-bastion"}` }, nil},
		{"bastions.grant", func() string { return `{"bastion_id":"` + bastion + `","allow":["inference"],"models":["llama3:8b"]}` }, func(o map[string]any) { state["grant"] = str(o["id"]) }},
		{"bastions.revokeGrant", func() string { return `{"id":"` + state["grant"] + `"}` }, nil},
		{"bastions.op", func() string { return `{"bastion_id":"` + bastion + `","kind":"observe:disk","args":{}}` }, nil},
		{"bastions.unpair", func() string { return `{"id":"` + bastion + `"}` }, nil},
		{"tenants.delete", func() string { return `{"id":"` + state["tenant"] + `"}` }, nil},
		{"nodes.revoke", func() string { return `{"node_id":"` + node + `","serial":"` + serial + `"}` }, nil},
		{"nodes.delete", func() string { return `{"id":"` + offline + `"}` }, nil},
	}
	walked := map[string]bool{}
	for _, s := range steps {
		out := call(t, s.method, s.body())
		if t.Failed() {
			t.FailNow()
		}
		if s.keep != nil {
			s.keep(out)
		}
		walked[s.method] = true
	}
	mutating := 0
	for _, m := range e.CP.API.Methods() {
		if m.Mutates {
			mutating++
			if !walked[m.Name] {
				t.Errorf("mutating method %s is not walked", m.Name)
			}
		}
	}
	if mutating != len(steps) {
		t.Errorf("%d mutating methods, %d walked", mutating, len(steps))
	}
}

// sshPublicKeyLine is a fresh Ed25519 key as an authorized_keys line.
func sshPublicKeyLine(t *testing.T) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	k, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k)))
}
