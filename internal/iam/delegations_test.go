package iam_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// delegated is a tenant with a person bound to a role that allows only
// sandbox actions, and an agent acting for it bound to the admin role.
type delegated struct {
	s                     *iam.Service
	clk                   *clock.Fake
	tenant                string
	person, agent, pBind  string
	changed               *atomic.Int64
	actor, asPerson, asAg audit.Entry
}

func newDelegated(t *testing.T, db *store.DB) delegated {
	t.Helper()
	ctx := context.Background()
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	d := delegated{s: iam.New(db, clk), clk: clk, changed: &atomic.Int64{}}
	d.s.OnAccessChanged(func() { d.changed.Add(1) })
	root := audit.Entry{TenantID: iam.RootTenant, Actor: "admin"}
	tn, err := d.s.CreateTenant(ctx, root, "", "acme")
	if err != nil {
		t.Fatal(err)
	}
	d.tenant = tn.ID
	d.actor = audit.Entry{TenantID: tn.ID, Actor: "admin"}
	p, err := d.s.CreateIdentity(ctx, d.actor, tn.ID, "alice", "person")
	if err != nil {
		t.Fatal(err)
	}
	a, err := d.s.CreateAgentFor(ctx, d.actor, tn.ID, "claude", p.ID)
	if err != nil {
		t.Fatal(err)
	}
	d.person, d.agent = p.ID, a.ID
	role, err := d.s.CreateRole(ctx, d.actor, tn.ID, "sandboxer", []iam.Statement{{Effect: "allow", Actions: []string{"compute:sandboxes:*"}, Resources: []string{"*"}}})
	if err != nil {
		t.Fatal(err)
	}
	if d.pBind, err = d.s.Bind(ctx, d.actor, tn.ID, p.ID, role.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := d.s.Bind(ctx, d.actor, tn.ID, a.ID, "admin"); err != nil {
		t.Fatal(err)
	}
	d.asPerson = audit.Entry{TenantID: tn.ID, Actor: p.ID}
	d.asAg = audit.Entry{TenantID: tn.ID, Actor: a.ID}
	return d
}

func (d delegated) allowed(t *testing.T, identity, action string) bool {
	t.Helper()
	ctx := context.Background()
	chain, err := d.s.Chain(ctx, d.tenant)
	if err != nil {
		t.Fatal(err)
	}
	ok, err := d.s.Decide(ctx, identity, action, "tenant/"+d.tenant, chain, nil)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// An agent acting for a person is allowed an action only when both its
// own bindings and its person's allow it: bound to admin, it still cannot
// make a role its person cannot; once its person's binding is removed,
// while it or its person is suspended, or once its delegation is revoked,
// it is refused what it could do before (and a revoked agent stays
// refused when its person is bound again). Each change pokes
// OnAccessChanged.
func TestAgentIsCappedByItsPerson(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		d := newDelegated(t, db)
		if !d.allowed(t, d.agent, "compute:sandboxes:create") || d.allowed(t, d.agent, "compute:roles:create") {
			t.Fatal("the agent is not capped by its person's role")
		}
		if !d.allowed(t, d.person, "compute:sandboxes:create") {
			t.Fatal("the person is refused its own role")
		}
		before := d.changed.Load()
		if err := d.s.Unbind(ctx, d.actor, d.tenant, d.pBind); err != nil {
			t.Fatal(err)
		}
		if d.allowed(t, d.agent, "compute:sandboxes:create") {
			t.Fatal("the agent keeps what its person's removed binding allowed")
		}
		if _, err := d.s.Bind(ctx, d.actor, d.tenant, d.person, "admin"); err != nil {
			t.Fatal(err)
		}
		if !d.allowed(t, d.agent, "compute:roles:create") {
			t.Fatal("the agent is refused what both allow")
		}
		for _, who := range []string{d.agent, d.person} {
			if err := d.s.SetSuspended(ctx, d.actor, d.tenant, who, true); err != nil {
				t.Fatal(err)
			}
			if d.allowed(t, d.agent, "compute:sandboxes:create") {
				t.Fatalf("the agent is allowed while %s is suspended", who)
			}
			if err := d.s.SetSuspended(ctx, d.actor, d.tenant, who, false); err != nil {
				t.Fatal(err)
			}
			if !d.allowed(t, d.agent, "compute:sandboxes:create") {
				t.Fatalf("the agent is refused once %s is resumed", who)
			}
		}
		if err := d.s.SetSuspended(ctx, d.asAg, d.tenant, d.agent, true); errs.CodeOf(err) != errs.InvalidState {
			t.Fatalf("an identity suspending itself: %v, want INVALID_STATE", err)
		}
		if err := d.s.RevokeDelegation(ctx, d.actor, d.tenant, d.agent); err != nil {
			t.Fatal(err)
		}
		if d.allowed(t, d.agent, "compute:sandboxes:create") {
			t.Fatal("an agent whose delegation is revoked is allowed")
		}
		if err := d.s.RevokeDelegation(ctx, d.actor, d.tenant, d.agent); errs.CodeOf(err) != errs.NotFound {
			t.Fatalf("revoking twice: %v, want NOT_FOUND", err)
		}
		if n := d.changed.Load() - before; n < 6 {
			t.Fatalf("OnAccessChanged ran %d times for an unbinding, four suspensions and a revocation", n)
		}
	})
}

// Deleting the person revokes its agents' delegations: the agent is not
// freed of its person's limits, it is refused.
func TestDeletingThePersonRefusesItsAgent(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		d := newDelegated(t, db)
		if err := d.s.DeleteIdentity(context.Background(), d.actor, d.tenant, d.person); err != nil {
			t.Fatal(err)
		}
		if d.allowed(t, d.agent, "compute:sandboxes:list") {
			t.Fatal("the agent of a deleted person is allowed")
		}
	})
}

// A delegation names a person of the agent's own tenant: a missing
// identity and another tenant's person read alike, an agent is refused
// with its own message (all INVALID_INPUT), and nothing is made.
func TestDelegationNeedsAPersonOfTheTenant(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		d := newDelegated(t, db)
		other, err := d.s.CreateTenant(ctx, audit.Entry{TenantID: iam.RootTenant, Actor: "admin"}, "", "other")
		if err != nil {
			t.Fatal(err)
		}
		stranger, err := d.s.CreateIdentity(ctx, audit.Entry{TenantID: other.ID, Actor: "admin"}, other.ID, "bob", "person")
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct{ name, person, msg string }{
			{"missing", "i_nobody", "for: no such person in this tenant"},
			{"elsewhere", stranger.ID, "for: no such person in this tenant"},
			{"an-agent", d.agent, "for: the identity is an agent"},
		} {
			_, err := d.s.CreateAgentFor(ctx, d.actor, d.tenant, "x-"+c.name, c.person)
			if errs.CodeOf(err) != errs.InvalidInput || !strings.HasPrefix(errs.SafeMessage(err), c.msg) {
				t.Errorf("%s: %v, want INVALID_INPUT %q", c.name, err, c.msg)
			}
		}
		ids, err := d.s.ListIdentities(ctx, d.tenant)
		if err != nil || len(ids) != 2 {
			t.Fatalf("identities after refusals: %v %v", ids, err)
		}
	})
}

// A held-back request waits for its person: the same text is one
// request; only the person may approve (the agent may not); an approval
// admits exactly one call with the same text; while it is open a call
// with another text is refused approval-mismatch, and so is the same call
// once the approval is used; an expired approval no longer counts, and an
// expired request cannot be approved.
func TestApprovalAdmitsOneCallWithItsText(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		d := newDelegated(t, db)
		k := iam.ConfirmKey{Tenant: d.tenant, Agent: d.agent, Person: d.person, Action: "compute:sandboxes:create", Resource: "tenant/" + d.tenant, Method: "sandboxes.create"}
		p, ok, err := d.s.Confirm(ctx, d.asAg, k, "lifetime: 600 s\n")
		if err != nil || ok || p.State != iam.ApprovalPending {
			t.Fatalf("first call: %+v %v %v, want pending", p, ok, err)
		}
		if again, _, _ := d.s.Confirm(ctx, d.asAg, k, "lifetime: 600 s\n"); again.ID != p.ID {
			t.Fatalf("the same text made a second request %s", again.ID)
		}
		if _, err := d.s.DecideApproval(ctx, d.asAg, d.tenant, p.ID, true); errs.CodeOf(err) != errs.AccessDenied {
			t.Fatalf("the agent approving its own request: %v, want ACCESS_DENIED", err)
		}
		if _, err := d.s.DecideApproval(ctx, d.asPerson, d.tenant, p.ID, true); err != nil {
			t.Fatal(err)
		}
		mismatch := func(text string) {
			t.Helper()
			_, ok, err := d.s.Confirm(ctx, d.asAg, k, text)
			if ok || errs.CodeOf(err) != errs.AccessDenied || !strings.HasPrefix(errs.SafeMessage(err), iam.ReasonApprovalMismatch+":") {
				t.Fatalf("%q: admitted %v, %v; want ACCESS_DENIED approval-mismatch", text, ok, err)
			}
		}
		mismatch("lifetime: 900 s\n")
		if _, ok, err := d.s.Confirm(ctx, d.asAg, k, "lifetime: 600 s\n"); !ok || err != nil {
			t.Fatalf("the approved call: admitted %v, %v", ok, err)
		}
		mismatch("lifetime: 600 s\n")
		d.clk.Advance(iam.ApprovalLifetime + time.Second)
		next, ok, err := d.s.Confirm(ctx, d.asAg, k, "lifetime: 600 s\n")
		if err != nil || ok || next.ID == p.ID {
			t.Fatalf("after the approval expired: %+v %v %v, want a new request", next, ok, err)
		}
		d.clk.Advance(iam.ApprovalLifetime + time.Second)
		if _, err := d.s.DecideApproval(ctx, d.asPerson, d.tenant, next.ID, true); errs.CodeOf(err) != errs.InvalidState {
			t.Fatalf("approving an expired request: %v, want INVALID_STATE", err)
		}
	})
}
