package integration

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// admitAPIError returns err as the API's error answer, failing the test when it
// is something else.
func admitAPIError(t *testing.T, err error) *client.Error {
	t.Helper()
	var ae *client.Error
	if !errors.As(err, &ae) {
		t.Fatalf("want an API error answer, got %v", err)
	}
	return ae
}

// admitWantRefusal checks err is the API answer code with a message starting
// with reason.
func admitWantRefusal(t *testing.T, what string, err error, code, reason string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: accepted, want %s %s", what, code, reason)
	}
	ae := admitAPIError(t, err)
	if ae.Code != code || !strings.HasPrefix(ae.Message, reason) {
		t.Fatalf("%s: %s %q, want %s %s", what, ae.Code, ae.Message, code, reason)
	}
}

// admitCommandRows counts the command rows of kind.
func admitCommandRows(t *testing.T, e *testenv.Env, kind string) int {
	t.Helper()
	var n int
	if err := e.CP.DB.QueryRowContext(context.Background(), `SELECT COUNT(*) FROM commands WHERE kind = $1`, kind).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestOwnedKindsRefusedOnGenericPath: a root-tenant operator, whom the
// policy refuses sandboxes.exec, cannot reach the same effect by queueing a
// raw sandbox.exec (or any sandbox.* kind) through commands.create,
// commands.fanout or commands.createInBatch; nor can root's admin. Only the
// sandboxes module creates its kinds.
func TestOwnedKindsRefusedOnGenericPath(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		ctx := context.Background()
		node := e.Nodes[0].NodeID()
		op := e.IdentityClient(t, "root", "operator-1", "operator")
		// The operator's policy does not allow the sandbox module's exec.
		err := op.Call(ctx, "sandboxes.exec", map[string]any{"id": "sb_missing", "argv": []string{"id"}}, nil)
		if err == nil || admitAPIError(t, err).Code == "INVALID_INPUT" {
			t.Fatalf("operator sandboxes.exec: %v, want a refusal", err)
		}
		payload := json.RawMessage(`{"sandbox_id":"sb_x","argv":["/bin/sh","-c","id"]}`)
		for _, c := range []struct {
			who string
			cl  *client.Client
		}{{"operator", op}, {"root admin", e.Client}} {
			for _, kind := range []string{"sandbox.exec", "sandbox.create", "sandbox.delete", "sandbox.update"} {
				_, err := c.cl.CreateCommand(ctx, node, kind, payload)
				admitWantRefusal(t, c.who+" commands.create "+kind, err, "INVALID_INPUT", "kind-owned-by-module")
			}
			err := c.cl.Call(ctx, "commands.fanout", map[string]any{"node_ids": []string{node}, "kind": "sandbox.exec", "payload": payload}, nil)
			admitWantRefusal(t, c.who+" commands.fanout", err, "INVALID_INPUT", "kind-owned-by-module")
			err = c.cl.Call(ctx, "commands.createInBatch", map[string]any{"node_id": node, "kind": "sandbox.exec", "payload": payload, "batch_id": "qb_x"}, nil)
			admitWantRefusal(t, c.who+" commands.createInBatch", err, "INVALID_INPUT", "kind-owned-by-module")
		}
		if n := admitCommandRows(t, e, "sandbox.exec"); n != 0 {
			t.Fatalf("%d sandbox.exec rows written, want 0", n)
		}
	})
}

// TestKindNotAllowedForRoleAtCreate: the control plane refuses, when it is
// created, a kind the node's certificate role does not run, on every
// generic path; TestKindNotAllowedForRole shows the node still refuses one
// forced into the queue.
func TestKindNotAllowedForRoleAtCreate(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		ctx := context.Background()
		n := e.Join(t, pki.RoleNodeTenant, "tenant-box")
		_, err := e.Client.CreateCommand(ctx, n.NodeID(), "disk.wipe", nil)
		admitWantRefusal(t, "commands.create", err, "INVALID_INPUT", "kind-not-allowed-for-role")
		err = e.Client.Call(ctx, "commands.fanout", map[string]any{"node_ids": []string{n.NodeID()}, "kind": "disk.wipe"}, nil)
		admitWantRefusal(t, "commands.fanout", err, "INVALID_INPUT", "kind-not-allowed-for-role")
		err = e.Client.Call(ctx, "commands.createInBatch", map[string]any{"node_id": n.NodeID(), "kind": "disk.wipe", "payload": json.RawMessage(`{}`), "batch_id": "qb_x"}, nil)
		admitWantRefusal(t, "commands.createInBatch", err, "INVALID_INPUT", "kind-not-allowed-for-role")
		if rows := admitCommandRows(t, e, "disk.wipe"); rows != 0 {
			t.Fatalf("%d disk.wipe rows written, want 0", rows)
		}
		// A kind the role runs is still accepted.
		if _, err := e.Client.CreateCommand(ctx, n.NodeID(), "diag.run", nil); err != nil {
			t.Fatalf("diag.run on a node-tenant node: %v", err)
		}
	})
}

// admitJoinNode joins a node into tenant with a token that tenant made, and
// returns its id (the node is not started).
func admitJoinNode(t *testing.T, e *testenv.Env, tenant, role, name string) string {
	t.Helper()
	ctx := context.Background()
	tok, err := e.CP.Nodes.CreateJoinToken(ctx, audit.Entry{TenantID: tenant, Actor: "test"}, role, name, time.Hour)
	if err != nil {
		t.Fatalf("join token: %v", err)
	}
	id, err := daemon.Join(ctx, daemon.JoinOptions{DataDir: filepath.Join(e.Dir, "nodes", tok.ID), Gateway: e.CP.GatewayAddr, Token: tok.Token, Name: name})
	if err != nil {
		t.Fatalf("join: %v", err)
	}
	return id.NodeID
}

// TestCommandSecretRefsCheckedAtCreate: a command whose payload names
// another tenant's secret reference, anywhere in its JSON, or a fleet
// secret on a node outside the root tenant, is refused when it is
// created, with exactly the answer a missing secret gets.
func TestCommandSecretRefsCheckedAtCreate(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		ctx := context.Background()
		a, adminA := e.TenantAdmin(t, "tenant-a")
		b, _ := e.TenantAdmin(t, "tenant-b")
		put := func(tenant, name, scope string) {
			t.Helper()
			if _, err := e.CP.Secrets.Put(ctx, audit.Entry{TenantID: tenant, Actor: "test"}, tenant, name, scope, []byte("value-"+name)); err != nil {
				t.Fatalf("put %s/%s: %v", tenant, name, err)
			}
		}
		put("root", "fleet", "fleet")
		put(b, "db-password", "tenant")
		put(a, "own", "tenant")
		nodeA := admitJoinNode(t, e, a, pki.RoleNodeTenant, "a-box")
		rootNode := e.Nodes[0].NodeID()

		create := func(cl *client.Client, node, payload string) error {
			_, err := cl.CreateCommand(ctx, node, "diag.run", json.RawMessage(payload))
			return err
		}
		missing := admitAPIError(t, create(adminA, nodeA, `{"ref":"secret://`+a+`/missing"}`))
		if missing.Code != "NOT_FOUND" {
			t.Fatalf("missing secret: %s %q, want NOT_FOUND", missing.Code, missing.Message)
		}
		same := func(what string, err error) {
			t.Helper()
			if err == nil {
				t.Fatalf("%s: accepted, want the missing-secret answer", what)
			}
			got := admitAPIError(t, err)
			if got.Status != missing.Status || got.Code != missing.Code || got.Message != missing.Message {
				t.Fatalf("%s: %d %s %q, want exactly %d %s %q", what, got.Status, got.Code, got.Message, missing.Status, missing.Code, missing.Message)
			}
		}
		foreign := "secret://" + b + "/db-password"
		same("another tenant's ref", create(adminA, nodeA, `{"ref":"`+foreign+`"}`))
		same("nested in argv", create(adminA, nodeA, `{"argv":["run","--token=`+foreign+`"]}`))
		same("as an object key", create(adminA, nodeA, `{"env":{"`+foreign+`":1}}`))
		same("escaped", create(adminA, nodeA, `{"x":"secret:\/\/`+b+`\u002fdb-password"}`))
		same("a fleet secret on a tenant node", create(adminA, nodeA, `{"ref":"secret://root/fleet"}`))
		same("root naming a fleet secret on a tenant node", create(e.Client, nodeA, `{"ref":"secret://root/fleet"}`))
		same("root naming a tenant secret on its own node", create(e.Client, rootNode, `{"ref":"`+foreign+`"}`))
		err := adminA.Call(ctx, "commands.fanout", map[string]any{"node_ids": []string{nodeA}, "kind": "diag.run", "payload": json.RawMessage(`{"ref":"` + foreign + `"}`)}, nil)
		same("fanout", err)
		if rows := admitCommandRows(t, e, "diag.run"); rows != 0 {
			t.Fatalf("%d diag.run rows written, want 0", rows)
		}
		// What the command may use is accepted.
		if err := create(adminA, nodeA, `{"ref":"secret://`+a+`/own"}`); err != nil {
			t.Fatalf("own secret: %v", err)
		}
		if err := create(e.Client, rootNode, `{"ref":"secret://root/fleet"}`); err != nil {
			t.Fatalf("fleet secret on a root node: %v", err)
		}
	})
}

// A module's commands carry its callers' strings to a host of the root
// tenant (a sandbox's argv): a secret reference in them is refused with one
// answer whether or not the fleet secret exists, so a tenant can neither
// learn which fleet secrets exist nor bind one to the host.
func TestModuleCommandsTakeNoSecretRefs(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1, SandboxRuntime: spec.RuntimeSim})
		ctx := context.Background()
		if err := e.Client.Call(ctx, "secrets.put", map[string]any{"name": "fleetdemo", "value_base64": "aGk="}, nil); err != nil {
			t.Fatal(err)
		}
		tenant, admin := e.TenantAdmin(t, "acme")
		if _, err := e.CP.Sandboxes.ImportBytes(ctx, audit.Entry{TenantID: tenant, Actor: "test"}, tenant, "busybox", busyboxTar(t)); err != nil {
			t.Fatal(err)
		}
		if err := admin.Call(ctx, "templates.create", map[string]any{"name": "t", "image": "busybox", "runtime": spec.RuntimeSim,
			"limits": map[string]any{"cpu_millis": 100, "memory_mb": 64, "pids": 64, "disk_mb": 16}, "lifetime_seconds": 600, "max_lifetime_seconds": 600}, nil); err != nil {
			t.Fatal(err)
		}
		x, err := admin.CreateSandbox(ctx, "", "t")
		if err != nil {
			t.Fatal(err)
		}
		var answers []string
		for _, ref := range []string{"secret://root/fleetdemo", "secret://root/nothere", "secret://" + tenant + "/x"} {
			_, err := admin.Exec(ctx, x.ID, []string{"echo", ref}, 5)
			var ce *client.Error
			if !errors.As(err, &ce) || ce.Code != "INVALID_INPUT" {
				t.Fatalf("exec naming %s: %v, want INVALID_INPUT", ref, err)
			}
			answers = append(answers, ce.Message)
		}
		if answers[0] != answers[1] || answers[1] != answers[2] {
			t.Fatalf("answers differ: %q", answers)
		}
	})
}
