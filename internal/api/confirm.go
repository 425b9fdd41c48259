package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
)

// The confirm stage (after decide): a call by an agent acting for a person
// (an identity with a delegation, internal/iam/delegations.go) of a
// method that describes itself (Method.describe: sandboxes.create,
// sandboxes.extend, batches.create, and commands.create and
// commands.fanout of a kind the tenant holds back) is held until the
// person approves its text. The text is built only from the decoded input
// and the control plane's own records, deterministically, with every
// caller string clipped to one line and control characters removed; the
// approval admits exactly one call whose text has the same digest
// (iam.Service.Confirm).

// describer builds the text of one call of a method that may be held
// back; held is false when this call needs no confirmation (a command
// kind the tenant does not hold back). It reads the control plane's own
// records (a template) with the caller's scope.
type describer func(ctx context.Context, s *Server, c *Caller, in any) (text string, held bool, err error)

// agentKey keys the caller's delegation in a call's context.
type agentKey struct{}

// AgentOf returns the delegation of the agent a call comes from, as the
// confirm stage found it; ok is false for a caller that is no delegated
// agent (or a call that did not pass the stage).
func AgentOf(ctx context.Context) (d iam.Delegation, ok bool) {
	d, ok = ctx.Value(agentKey{}).(iam.Delegation)
	return d, ok
}

// agentRefused are the methods a delegated agent may never call, whatever
// its roles and its person's: approving or denying held-back requests and
// choosing which kinds are held back are its person's; a key for another
// identity (its person's among them) would let it speak for that identity.
// Updating or deleting a template is its person's too: a held sandbox
// create is described by its template, which the agent could otherwise
// change between the approved description and the create.
var agentRefused = map[string]bool{"approvals.approve": true, "approvals.deny": true, "approvals.setKinds": true,
	"templates.update": true, "templates.delete": true}

// confirm is the stage after decide. It reads the caller's delegation only
// for a method that can be held back or refused to agents.
func (s *Server) confirm(q *call) error {
	c, m := q.c, q.m
	keyForOther := m.Name == "apiKeys.create" && q.in.(apitypes.APIKeyCreateIn).IdentityID != c.Identity
	if m.describe == nil && !agentRefused[m.Name] && !keyForOther {
		return nil
	}
	d, ok, err := s.deps.IAM.DelegationOf(q.ctx, c.Identity)
	if err != nil || !ok {
		return err
	}
	if !d.Active() || agentRefused[m.Name] || keyForOther {
		s.recordDenial(q.ctx, c, m, q.target, "agent")
		return errs.New(errs.AccessDenied, m.Action+" is not allowed to an agent acting for a person (its delegation is revoked, or the method is its person's)")
	}
	q.ctx = context.WithValue(q.ctx, agentKey{}, d)
	if m.describe == nil {
		return nil
	}
	text, held, err := m.describe(q.ctx, s, c, q.in)
	if err != nil || !held {
		return err
	}
	text = requestText(d, m.Name, c.ActingTenant, text)
	k := iam.ConfirmKey{Tenant: c.ActingTenant, Agent: d.AgentID, Person: d.PersonID, Action: m.Action, Resource: q.resource, Method: m.Name}
	a, admitted, err := s.deps.IAM.Confirm(q.ctx, c.Actor(), k, text)
	switch {
	case errs.CodeOf(err) == errs.AccessDenied:
		s.recordDenial(q.ctx, c, m, q.target, iam.ReasonApprovalMismatch)
		return err
	case err != nil || admitted:
		return err
	}
	return errs.New(errs.ConfirmationRequired, fmt.Sprintf("request %s waits for the confirmation of %s: run `better-compute approvals approve %s` as %s, then send the same call again; the request reads:\n%s",
		a.ID, clip(d.PersonName), a.ID, d.PersonID, a.Text))
}

// requestText is the whole text a person reads: who asks, for whom, the
// method and tenant, then the method's own lines.
func requestText(d iam.Delegation, method, tenant, body string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "agent %s (%s) acting for %s (%s) asks:\n", clip(d.AgentName), d.AgentID, clip(d.PersonName), d.PersonID)
	fmt.Fprintf(&b, "method: %s\ntenant: %s\n", method, clip(tenant))
	b.WriteString(body)
	return b.String()
}

// maxClip bounds, in runes, one caller string in a request's text.
const maxClip = 120

// clip makes a caller string safe for one line of a request's text: only
// its first line, invalid UTF-8 replaced, control and format characters
// (bidirectional overrides among them) removed, at most maxClip runes
// ("…" marks a cut).
func clip(s string) string {
	if i := strings.IndexAny(s, "\n\r\v\f\u0085\u2028\u2029"); i >= 0 {
		s = s[:i] + "…"
	}
	var b strings.Builder
	n := 0
	for _, r := range s {
		// An invalid byte reads as utf8.RuneError and is written as U+FFFD.
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			continue
		}
		if n == maxClip {
			b.WriteString("…")
			break
		}
		b.WriteRune(r)
		n++
	}
	return b.String()
}

// bytesLine describes bytes by size and SHA-256 ("none" when empty): a
// payload's content never enters the text.
func bytesLine(p []byte) string {
	if len(p) == 0 {
		return "none"
	}
	d := sha256.Sum256(p)
	return fmt.Sprintf("%d bytes, sha256 %s", len(p), hex.EncodeToString(d[:]))
}

// listLine describes a list of caller strings on one line: every item
// (clipped) when there are at most maxListed, else the first maxListed,
// the count and the SHA-256 of all the items as sent (one per line), so
// two different lists never read alike.
func listLine(items []string) string {
	shown := make([]string, 0, min(len(items), maxListed))
	for _, it := range items[:min(len(items), maxListed)] {
		shown = append(shown, clip(it))
	}
	return fmt.Sprintf("%d (%s)%s", len(items), strings.Join(shown, ", "), rest(items))
}

// maxListed bounds the items of a list a request's text shows one by one.
const maxListed = 16

// rest is what a list's text says of its items past maxListed: how many,
// and the SHA-256 of all the items as sent ("" when none are left out).
func rest(items []string) string {
	if len(items) <= maxListed {
		return ""
	}
	d := sha256.Sum256([]byte(strings.Join(items, "\n")))
	return fmt.Sprintf(" and %d more; all sha256 %s", len(items)-maxListed, hex.EncodeToString(d[:]))
}

// agentDenied is the refusal of a delegated agent's call that IAM denied,
// saying why an agent may be refused (its delegation revoked, or what
// both it and its person may do) instead of the generic message; nil
// for a caller that is no delegated agent. It names no resource, so it
// tells no more than the generic refusal about what exists.
func (s *Server) agentDenied(ctx context.Context, c *Caller, action string) error {
	d, ok, err := s.deps.IAM.DelegationOf(ctx, c.Identity)
	if err != nil || !ok {
		return nil
	}
	if !d.Active() {
		return errs.New(errs.AccessDenied, action+" is not allowed: this agent's delegation to act for "+d.PersonName+" is revoked")
	}
	return errs.New(errs.AccessDenied, action+" is not allowed: an agent acting for "+d.PersonName+
		" may do only what both its own roles and its person's allow, while neither is suspended")
}
