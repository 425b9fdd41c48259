package integration

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// agentSetup is a tenant with the template "small" (sim runtime), a
// person alice bound to a role allowing sandboxes and approvals only, and
// an agent claude acting for alice, bound to the built-in admin role.
type agentSetup struct {
	e                     *testenv.Env
	tenant                string
	admin, alice, agent   *client.Client
	aliceID, agentID, bID string
}

func startAgent(t *testing.T, db *store.DB) agentSetup {
	t.Helper()
	ctx := context.Background()
	e := testenv.Start(t, db, testenv.Options{Nodes: 1, SandboxRuntime: spec.RuntimeSim})
	tenant, admin := e.TenantAdmin(t, "acme")
	importSmallTemplate(t, e, admin, spec.RuntimeSim, 0)
	s := agentSetup{e: e, tenant: tenant, admin: admin}
	var role, person, agent struct{ ID string }
	if err := admin.Call(ctx, "roles.create", map[string]any{"name": "sandboxer", "statements": []map[string]any{
		{"effect": "allow", "actions": []string{"compute:sandboxes:*", "compute:approvals:*"}, "resources": []string{"*"}}}}, &role); err != nil {
		t.Fatal(err)
	}
	if err := admin.Call(ctx, "identities.create", map[string]any{"name": "alice", "kind": "person"}, &person); err != nil {
		t.Fatal(err)
	}
	if err := admin.Call(ctx, "identities.create", map[string]any{"name": "claude", "kind": "agent", "for": person.ID}, &agent); err != nil {
		t.Fatal(err)
	}
	var bind struct{ ID string }
	if err := admin.Call(ctx, "bindings.create", map[string]any{"identity_id": person.ID, "role_id": role.ID}, &bind); err != nil {
		t.Fatal(err)
	}
	if err := admin.Bind(ctx, "", agent.ID, "admin"); err != nil {
		t.Fatal(err)
	}
	s.aliceID, s.agentID, s.bID = person.ID, agent.ID, bind.ID
	s.alice, s.agent = keyFor(t, e, admin, person.ID), keyFor(t, e, admin, agent.ID)
	return s
}

func keyFor(t *testing.T, e *testenv.Env, admin *client.Client, identity string) *client.Client {
	t.Helper()
	k, err := admin.CreateAPIKey(context.Background(), "", identity, identity, 0)
	if err != nil {
		t.Fatal(err)
	}
	return e.NewClient(t, k.Key)
}

var requestIDRE = regexp.MustCompile(`^request (ap_[A-Za-z0-9_-]+) waits`)

// mustHeld asserts err is CONFIRMATION_REQUIRED and returns the request's
// id and text.
func mustHeld(t *testing.T, err error) (id, text string) {
	t.Helper()
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != "CONFIRMATION_REQUIRED" || ce.Status != 409 {
		t.Fatalf("err = %v, want 409 CONFIRMATION_REQUIRED", err)
	}
	m := requestIDRE.FindStringSubmatch(ce.Message)
	_, text, ok := strings.Cut(ce.Message, "the request reads:\n")
	if m == nil || !ok {
		t.Fatalf("the answer names no request and text: %q", ce.Message)
	}
	return m[1], text
}

// mustMismatch asserts err is ACCESS_DENIED with reason approval-mismatch.
func mustMismatch(t *testing.T, err error) {
	t.Helper()
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Code != "ACCESS_DENIED" || !strings.HasPrefix(ce.Message, iam.ReasonApprovalMismatch+": ") {
		t.Fatalf("err = %v, want ACCESS_DENIED approval-mismatch", err)
	}
}

// TestAgentSandboxWaitsForItsPerson: an agent acting for a person asks
// for a sandbox and is answered CONFIRMATION_REQUIRED with the request's
// id and text (template, image, lifetime); the agent cannot approve it
// itself, nor can an admin who is not its person; the person sees the
// same text and approves; a call whose text differs (the template's
// lifetime changed) is refused approval-mismatch while the approval is
// open; the approved call then succeeds once, and the same call again is
// refused approval-mismatch, as is a restore of the agent's own
// checkpoint (held like any create).
func TestAgentSandboxWaitsForItsPerson(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		s := startAgent(t, db)
		_, err := s.agent.CreateSandbox(ctx, "", "small")
		id, text := mustHeld(t, err)
		for _, want := range []string{"agent claude (" + s.agentID + ") acting for alice (" + s.aliceID + ") asks:\n", "method: sandboxes.create\n",
			"\ntemplate: small (", "\nimage: busybox (", "\nruntime: sim\n", "\nlifetime: 600 s (at most 1200 s)\n", "\nenv GREETING: 2 bytes, sha256 "} {
			if !strings.Contains(text, want) {
				t.Fatalf("the text lacks %q:\n%s", want, text)
			}
		}
		if err := s.agent.Call(ctx, "approvals.approve", map[string]any{"id": id}, nil); !errors.Is(err, client.ErrAccessDenied) {
			t.Fatalf("the agent approving its own request: %v, want ACCESS_DENIED", err)
		}
		if err := s.admin.Call(ctx, "approvals.approve", map[string]any{"tenant_id": s.tenant, "id": id}, nil); !errors.Is(err, client.ErrAccessDenied) {
			t.Fatalf("an admin who is not the person approving: %v, want ACCESS_DENIED", err)
		}
		var list struct{ Approvals []iam.Approval }
		if err := s.alice.Call(ctx, "approvals.list", map[string]any{}, &list); err != nil || len(list.Approvals) != 1 || list.Approvals[0].ID != id || list.Approvals[0].Text != text {
			t.Fatalf("the person's list: %+v %v, want %s with the agent's text", list, err, id)
		}
		var ap iam.Approval
		if err := s.alice.Call(ctx, "approvals.approve", map[string]any{"id": id}, &ap); err != nil || ap.State != iam.ApprovalApproved || ap.Digest != iam.TextDigest(text) {
			t.Fatalf("approve: %+v %v", ap, err)
		}
		setLifetime(t, s, 900)
		_, err = s.agent.CreateSandbox(ctx, "", "small")
		mustMismatch(t, err)
		setLifetime(t, s, 600)
		x, err := s.agent.CreateSandbox(ctx, "", "small")
		if err != nil || x.State != "running" {
			t.Fatalf("the approved call: %+v %v", x, err)
		}
		_, err = s.agent.CreateSandbox(ctx, "", "small")
		mustMismatch(t, err)
		// A restore of the agent's own checkpoint is a sandboxes.create
		// too: described by the checkpoint's own template and held like
		// any other (with the approval used, refused approval-mismatch),
		// never run unheld; a checkpoint it cannot read is refused
		// NOT_FOUND before anything is held.
		var ck struct{ ID string }
		if err := s.agent.Call(ctx, "sandboxes.checkpoint", map[string]any{"id": x.ID}, &ck); err != nil {
			t.Fatal(err)
		}
		mustMismatch(t, s.agent.Call(ctx, "sandboxes.create", map[string]any{"from_checkpoint": ck.ID}, nil))
		if err := s.agent.Call(ctx, "sandboxes.create", map[string]any{"from_checkpoint": "ckp_nosuchcheckpoint"}, nil); !errors.Is(err, client.ErrNotFound) {
			t.Fatalf("restoring a missing checkpoint: %v, want NOT_FOUND", err)
		}
	})
}

// setLifetime updates the template "small" as importSmallTemplate made
// it, with lifetime seconds.
func setLifetime(t *testing.T, s agentSetup, seconds int) {
	t.Helper()
	ctx := context.Background()
	var ts struct{ Templates []struct{ ID, Name string } }
	if err := s.admin.Call(ctx, "templates.list", map[string]any{}, &ts); err != nil || len(ts.Templates) != 1 {
		t.Fatalf("templates: %+v %v", ts, err)
	}
	if err := s.admin.Call(ctx, "templates.update", map[string]any{"id": ts.Templates[0].ID, "image": "busybox", "runtime": spec.RuntimeSim,
		"limits": map[string]any{"cpu_millis": 500, "memory_mb": 128, "pids": 64, "disk_mb": 32}, "lifetime_seconds": seconds,
		"max_lifetime_seconds": 1200, "env": map[string]string{"GREETING": "hi"}}, nil); err != nil {
		t.Fatalf("update template: %v", err)
	}
}

// TestAgentIsCappedAndRevocable: an agent bound to admin may do only what
// its person may (no role, no node list); removing its person's binding
// refuses it, suspending it refuses it until it is resumed, and revoking
// its delegation refuses it everything, each within 5 s (the decision
// reads the delegation and the suspension on every call).
func TestAgentIsCappedAndRevocable(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		s := startAgent(t, db)
		listSandboxes := func() error { return s.agent.Call(ctx, "sandboxes.list", map[string]any{}, nil) }
		if err := listSandboxes(); err != nil {
			t.Fatalf("the agent listing sandboxes (its person may): %v", err)
		}
		err := s.agent.Call(ctx, "roles.create", map[string]any{"name": "x", "statements": []map[string]any{{"effect": "allow", "actions": []string{"*"}, "resources": []string{"*"}}}}, nil)
		if !errors.Is(err, client.ErrAccessDenied) {
			t.Fatalf("the agent making a role its person may not: %v, want ACCESS_DENIED", err)
		}
		if err := s.agent.Call(ctx, "nodes.list", map[string]any{}, nil); !errors.Is(err, client.ErrAccessDenied) {
			t.Fatalf("the agent listing nodes its person may not: %v, want ACCESS_DENIED", err)
		}
		if err := s.admin.Call(ctx, "bindings.delete", map[string]any{"id": s.bID}, nil); err != nil {
			t.Fatal(err)
		}
		waitRefused(t, listSandboxes)
		if err := s.admin.Bind(ctx, "", s.aliceID, "admin"); err != nil {
			t.Fatal(err)
		}
		if err := listSandboxes(); err != nil {
			t.Fatalf("the agent after its person is bound again: %v", err)
		}
		if err := s.admin.Call(ctx, "identities.suspend", map[string]any{"id": s.agentID}, nil); err != nil {
			t.Fatal(err)
		}
		waitRefused(t, listSandboxes)
		if err := s.admin.Call(ctx, "identities.resume", map[string]any{"id": s.agentID}, nil); err != nil {
			t.Fatal(err)
		}
		if err := listSandboxes(); err != nil {
			t.Fatalf("the agent once resumed: %v", err)
		}
		if err := s.admin.Call(ctx, "delegations.revoke", map[string]any{"id": s.agentID}, nil); err != nil {
			t.Fatal(err)
		}
		waitRefused(t, listSandboxes)
		if err := listSandboxes(); err == nil || !strings.Contains(err.Error(), "this agent's delegation to act for alice is revoked") {
			t.Fatalf("the revoked agent's refusal does not say why: %v", err)
		}
		var ds struct{ Delegations []iam.Delegation }
		if err := s.admin.Call(ctx, "delegations.list", map[string]any{}, &ds); err != nil || len(ds.Delegations) != 1 || ds.Delegations[0].Active() {
			t.Fatalf("delegations after the revocation: %+v %v", ds, err)
		}
	})
}

// waitRefused waits, at most 5 s, until call answers ACCESS_DENIED,
// trying again on each tick of a 50 ms ticker.
func waitRefused(t *testing.T, call func() error) {
	t.Helper()
	deadline := time.NewTimer(5 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := call()
		if errors.Is(err, client.ErrAccessDenied) {
			return
		}
		select {
		case <-deadline.C:
			t.Fatalf("still not refused after 5 s: %v", err)
		case <-tick.C:
		}
	}
}

// TestAgentIdentityRefusals: identities.create with for refuses a person
// kind, a missing identity, another tenant's person and an agent, each
// INVALID_INPUT; and an agent may not make a key for its person (it would
// speak for it) nor choose which kinds are held back, even when its
// person may.
func TestAgentIdentityRefusals(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		s := startAgent(t, db)
		for _, c := range []struct{ kind, forWhom string }{
			{"person", s.aliceID}, {"agent", "i_nobody"}, {"agent", "admin"}, {"agent", s.agentID},
		} {
			err := s.admin.Call(ctx, "identities.create", map[string]any{"name": "x", "kind": c.kind, "for": c.forWhom}, nil)
			if !errors.Is(err, client.ErrInvalidInput) {
				t.Errorf("kind %s for %s: %v, want INVALID_INPUT", c.kind, c.forWhom, err)
			}
		}
		// Its person may make keys for others: the agent still may not.
		if err := s.admin.Bind(ctx, "", s.aliceID, "admin"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.agent.CreateAPIKey(ctx, "", s.aliceID, "stolen", 0); !errors.Is(err, client.ErrAccessDenied) {
			t.Fatalf("the agent making a key for its person: %v, want ACCESS_DENIED", err)
		}
		if err := s.agent.Call(ctx, "approvals.setKinds", map[string]any{"kinds": []string{}}, nil); !errors.Is(err, client.ErrAccessDenied) {
			t.Fatalf("the agent setting the held-back kinds: %v, want ACCESS_DENIED", err)
		}
	})
}

// TestAgentCannotRewriteTemplates: a delegated agent, even bound to admin
// and acting for an admin, may not update or delete a template (what its
// held sandbox creates are described by), while its person may.
func TestAgentCannotRewriteTemplates(t *testing.T) {
	ctx := context.Background()
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Nodes: 1, SandboxRuntime: spec.RuntimeSim})
	importSmallTemplate(t, e, e.Client, spec.RuntimeSim, 0)
	var agent struct{ ID string }
	if err := e.Client.Call(ctx, "identities.create", map[string]any{"name": "tpl-agent", "kind": "agent", "for": "admin"}, &agent); err != nil {
		t.Fatal(err)
	}
	if err := e.Client.Bind(ctx, "", agent.ID, "admin"); err != nil {
		t.Fatal(err)
	}
	ag := keyFor(t, e, e.Client, agent.ID)
	var ts struct{ Templates []struct{ ID string } }
	if err := e.Client.Call(ctx, "templates.list", map[string]any{}, &ts); err != nil || len(ts.Templates) != 1 {
		t.Fatalf("templates: %+v %v", ts, err)
	}
	id := ts.Templates[0].ID
	update := map[string]any{"id": id, "image": "busybox", "runtime": spec.RuntimeSim, "limits": map[string]any{"cpu_millis": 500, "memory_mb": 128, "pids": 64, "disk_mb": 32},
		"lifetime_seconds": 900, "max_lifetime_seconds": 1200}
	for _, c := range []struct {
		method string
		in     map[string]any
	}{{"templates.update", update}, {"templates.delete", map[string]any{"id": id}}} {
		if err := ag.Call(ctx, c.method, c.in, nil); !errors.Is(err, client.ErrAccessDenied) || !strings.Contains(err.Error(), "not allowed to an agent") {
			t.Fatalf("the agent's %s: %v, want ACCESS_DENIED for an agent", c.method, err)
		}
	}
	if err := e.Client.Call(ctx, "templates.update", update, nil); err != nil {
		t.Fatalf("the person's update: %v", err)
	}
}

// rootAgent makes, through the root admin's API, the person alice and the
// agent claude acting for her, both bound to admin in the root tenant,
// each with an API key: it returns their ids and keys.
func rootAgent(t *testing.T, e *testenv.Env) (alice, claude, aliceKey, claudeKey string) {
	t.Helper()
	ctx := context.Background()
	var p, a struct{ ID string }
	if err := e.Client.Call(ctx, "identities.create", map[string]any{"name": "alice", "kind": "person"}, &p); err != nil {
		t.Fatal(err)
	}
	if err := e.Client.Call(ctx, "identities.create", map[string]any{"name": "claude", "kind": "agent", "for": p.ID}, &a); err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{}
	for _, id := range []string{p.ID, a.ID} {
		if err := e.Client.Bind(ctx, "root", id, "admin"); err != nil {
			t.Fatal(err)
		}
		k, err := e.Client.CreateAPIKey(ctx, "root", id, id, 0)
		if err != nil {
			t.Fatal(err)
		}
		keys[id] = k.Key
	}
	return p.ID, a.ID, keys[p.ID], keys[a.ID]
}
