package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/bastions/opstest"
	"github.com/bettercompute/bettercompute/internal/server"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

const testApproval = opstest.Approval

// lanesEnv is a control plane running the lanes role, whose bastions
// module dials ops at a stand-in for the bastion's ops server (opstest), with a bastion node of tenantA.
func lanesEnv(t *testing.T, db *store.DB) (e *testenv.Env, tenantA string, adminA *client.Client, bastion string) {
	t.Helper()
	e = testenv.Start(t, db, testenv.Options{Tune: func(o *server.Options) {
		o.Roles = []string{server.RoleAPI, server.RoleGateway, server.RoleWorkers, server.RoleLanes}
		o.LanesListen = "127.0.0.1:0"
	}})
	e.CP.Bastions.SetOpsDialer(opstest.Start(t))
	tenantA, adminA = e.TenantAdmin(t, "tenant-a")
	bastion = "nbastionaaaaaaaa"
	if _, err := db.ExecContext(context.Background(), `INSERT INTO nodes (id, tenant_id, name, role, created_at) VALUES ($1, $2, $1, 'bastion', 0)`, bastion, tenantA); err != nil {
		t.Fatal(err)
	}
	return e, tenantA, adminA, bastion
}

// TestBastionsOp: bastions.op answers done with the result, and
// approval-required as an answer (not an error) until the same op carries
// the approval; a refusal of the bastion is its code with its reason,
// never its message; a malformed kind or args is INVALID_INPUT; another
// tenant's bastion answers as a missing one; an operator may not send ops;
// each op is audited before it is sent and after it is answered.
func TestBastionsOp(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e, tenantA, adminA, bastion := lanesEnv(t, db)
		ctx := context.Background()
		a, err := adminA.BastionOp(ctx, client.BastionOpIn{BastionID: bastion, Kind: "observe:disk", Args: json.RawMessage(`{}`)})
		if err != nil || a.Status != "done" || !jsonEqual(a.Result, `{"filesystems":[]}`) || len(a.OpID) != 29 {
			t.Fatalf("observe:disk: %+v %v", a, err)
		}
		in := client.BastionOpIn{BastionID: bastion, Kind: "files:move-plan", Args: json.RawMessage(`{"share":"sh_x","moves":[{"from":"a","to":""}]}`)}
		a, err = adminA.BastionOp(ctx, in)
		if err != nil || a.Status != "approval-required" || a.ApprovalRequest != testApproval || a.Summary != "move a to b" || a.ApprovalExpires == nil {
			t.Fatalf("move-plan: %+v %v", a, err)
		}
		in.Approval = testApproval
		if a, err = adminA.BastionOp(ctx, in); err != nil || a.Status != "done" {
			t.Fatalf("move-plan approved: %+v %v", a, err)
		}
		keyA := clientKey(t, adminA)
		r := do(t, e, "POST", "/api/v1/bastions.op", keyA, map[string]string{"X-Request-Id": "op-refused"}, `{"bastion_id":"`+bastion+`","kind":"observe:procs","args":{}}`)
		expectCode(t, r, 403, "ACCESS_DENIED")
		if r.message() != "the bastion refused the op (excluded)" || strings.Contains(string(r.body), "/home") {
			t.Fatalf("refusal: %s", r.body)
		}
		// An op's answer is never kept for a replay of its Idempotency-Key.
		idem := map[string]string{"Idempotency-Key": "op-once"}
		body := `{"bastion_id":"` + bastion + `","kind":"observe:disk","args":{}}`
		expectCode(t, do(t, e, "POST", "/api/v1/bastions.op", keyA, idem, body), 200, "")
		if r := do(t, e, "POST", "/api/v1/bastions.op", keyA, idem, body); r.status != 409 || r.code() != "CONFLICT" || strings.Contains(string(r.body), "filesystems") {
			t.Fatalf("replayed op: %d %s", r.status, r.body)
		}
		for _, body := range []string{`{"bastion_id":"B","kind":"observe","args":{}}`, `{"bastion_id":"B","kind":"observe:disk","args":[]}`,
			`{"bastion_id":"B","kind":"observe:disk","args":{},"approval":"apr_x"}`} {
			expectCode(t, do(t, e, "POST", "/api/v1/bastions.op", keyA, nil, strings.ReplaceAll(body, "B", bastion)), 400, "INVALID_INPUT")
		}
		_, adminB := e.TenantAdmin(t, "tenant-b")
		keyB := clientKey(t, adminB)
		var shapes []string
		for _, id := range []string{bastion, "nmissingxxxxxxxx"} {
			r := do(t, e, "POST", "/api/v1/bastions.op", keyB, nil, `{"bastion_id":"`+id+`","kind":"observe:disk","args":{}}`)
			shapes = append(shapes, strings.ReplaceAll(r.withoutRequestID(), id, "ID"))
		}
		if shapes[0] != shapes[1] {
			t.Fatalf("another tenant's bastion and a missing one differ:\n%s", strings.Join(shapes, "\n"))
		}
		op := e.IdentityClient(t, tenantA, "op", "operator")
		if _, err := op.BastionOp(ctx, client.BastionOpIn{BastionID: bastion, Kind: "observe:disk", Args: json.RawMessage(`{}`)}); !errors.Is(err, client.ErrAccessDenied) {
			t.Fatalf("an operator's op: %v", err)
		}
		var rows []string
		q, err := db.QueryContext(ctx, `SELECT outcome FROM audit_events WHERE request_id = 'op-refused' AND action = 'compute:bastions:op' AND tenant_id = $1 ORDER BY seq`, tenantA)
		if err != nil {
			t.Fatal(err)
		}
		defer q.Close()
		for q.Next() {
			var o string
			_ = q.Scan(&o)
			rows = append(rows, o)
		}
		if strings.Join(rows, ",") != "allowed,refused" {
			t.Fatalf("audit rows of a refused op: %v", rows)
		}
	})
}

// TestBastionTerminalEndpoint: the terminal endpoint asks for approval
// (409 APPROVAL_REQUIRED naming the command to run on the machine), then
// upgrades and carries bytes both ways; a malformed query is
// INVALID_INPUT; another tenant's bastion answers as a missing one; an
// operator may not open one; each request and answer is audited.
func TestBastionTerminalEndpoint(t *testing.T) {
	e, tenantA, adminA, bastion := lanesEnv(t, storetest.NewTestSQLite(t))
	ctx := context.Background()
	session := client.NewTerminalSession()
	_, err := adminA.BastionTerminal(ctx, bastion, session, false, "")
	var ce *client.Error
	want := "the bastion asks its person: run `bcd bastion approve " + testApproval + "` on that machine, then repeat with --session " + session + " --approval " + testApproval
	if !errors.As(err, &ce) || ce.Code != "APPROVAL_REQUIRED" || ce.Status != 409 || ce.Message != want {
		t.Fatalf("terminal without approval: %v", err)
	}
	c, err := adminA.BastionTerminal(ctx, bastion, session, false, testApproval)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	if p, err := br.Peek(2); err != nil || string(p) != "$ " {
		t.Fatalf("prompt %q %v", p, err)
	}
	_, _ = br.Discard(2)
	if _, err := c.Write([]byte("whoami\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := br.ReadString('\n'); err != nil || line != "whoami\n" {
		t.Fatalf("echo %q %v", line, err)
	}
	for _, bad := range []struct{ session, approval string }{{"ts_short", ""}, {session, "apr_x"}, {"", ""}} {
		if _, err := adminA.BastionTerminal(ctx, bastion, bad.session, false, bad.approval); !errors.Is(err, client.ErrInvalidInput) {
			t.Fatalf("%+v: %v", bad, err)
		}
	}
	_, adminB := e.TenantAdmin(t, "tenant-b")
	_, errOther := adminB.BastionTerminal(ctx, bastion, session, false, testApproval)
	_, errMissing := adminB.BastionTerminal(ctx, "nmissingxxxxxxxx", session, false, testApproval)
	if !errors.As(errOther, &ce) || ce.Code != "ACCESS_DENIED" || strings.ReplaceAll(ce.Message, bastion, "ID") != strings.ReplaceAll(errMissing.(*client.Error).Message, "nmissingxxxxxxxx", "ID") {
		t.Fatalf("another tenant's bastion %v, a missing one %v", errOther, errMissing)
	}
	op := e.IdentityClient(t, tenantA, "op", "operator")
	if _, err := op.BastionTerminal(ctx, bastion, session, false, testApproval); !errors.Is(err, client.ErrAccessDenied) {
		t.Fatalf("an operator's terminal: %v", err)
	}
	var n int
	if err := e.CP.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit_events WHERE tenant_id = $1 AND action = 'compute:bastions:terminal' AND outcome IN ('allowed', 'refused', 'answered')`, tenantA).Scan(&n); err != nil || n != 4 {
		t.Fatalf("%d terminal audit rows (%v), want 4: two requests and their answers", n, err)
	}
}

// jsonEqual reports whether raw is the JSON value want, whatever its
// spacing.
func jsonEqual(raw json.RawMessage, want string) bool {
	var a, b any
	return json.Unmarshal(raw, &a) == nil && json.Unmarshal([]byte(want), &b) == nil && reflect.DeepEqual(a, b)
}
