package iam

import "path"

// Request is what an access decision is asked: may the identity perform
// Action on Resource (a "<type>/<id>" path, or "tenant/<id>" for
// tenant-level actions), with the key's Scopes (empty: unscoped).
type Request struct {
	Action   string
	Resource string
	// Scopes, when not empty, further limit the actions (an API key's
	// scopes).
	Scopes []string
}

// Grant is one of an identity's bindings, as a decision sees it.
type Grant struct {
	// Tenant is the tenant the binding is made in; it applies there and
	// below.
	Tenant string
	// IdentityTenant is the bound identity's own tenant.
	IdentityTenant string
	// Statements are the statements of the binding's role.
	Statements []Statement
}

// inScope reports whether the request's action is within its scopes.
func (r Request) inScope() bool {
	return len(r.Scopes) == 0 || matchAny(r.Scopes, r.Action)
}

// possible reports whether any grant could allow the request on a
// resource whose tenant chain is chain: not for an empty chain (an unknown
// tenant), nor for an action outside the key's scopes. Decide reads
// nothing when it is false.
func (r Request) possible(chain []Tenant) bool {
	return len(chain) > 0 && r.inScope()
}

// tenantSet returns the ids of chain as a set.
func tenantSet(chain []Tenant) map[string]bool {
	set := make(map[string]bool, len(chain))
	for _, t := range chain {
		set[t.ID] = true
	}
	return set
}

// grantApplies reports whether a binding made in tenant, of an identity of
// idTenant, counts for a resource whose chain is inChain: it must be made
// in a tenant of the chain, and in a tenant at or above the identity's own
// (idChain, the identity's tenant chain; the rule Bind enforces), so a
// binding that names an identity of an ancestor, made before that rule or
// written around it, never applies: no tenant can deny root's admin in its
// own tenant.
func grantApplies(tenant, idTenant string, inChain, idChain map[string]bool) bool {
	if !inChain[tenant] {
		return false
	}
	return tenant == idTenant || idChain[tenant]
}

// Evaluate is the access decision, with no reads: whether the grants
// allow req on a resource of the tenant whose chain (nearest first) is
// chain, for an identity whose own tenant's chain is idChain. Grants in
// any tenant of the chain apply (and only those at or above the identity's
// own tenant); a matching deny beats any allow; no match is a deny; an
// empty chain or an action outside the scopes is a deny.
func Evaluate(req Request, chain, idChain []Tenant, grants []Grant) bool {
	if !req.possible(chain) {
		return false
	}
	inChain, ids := tenantSet(chain), tenantSet(idChain)
	allowed := false
	for _, g := range grants {
		if !grantApplies(g.Tenant, g.IdentityTenant, inChain, ids) {
			continue
		}
		switch statementsEffect(g.Statements, req.Action, req.Resource) {
		case effectDeny:
			return false
		case effectAllow:
			allowed = true
		}
	}
	return allowed
}

type effect int

const (
	effectNone effect = iota
	effectAllow
	effectDeny
)

// statementsEffect is what statements say about action on resource: deny
// when any matching statement denies, allow when one allows and none
// denies, none when no statement matches.
func statementsEffect(st []Statement, action, resource string) effect {
	out := effectNone
	for _, x := range st {
		if !matchAny(x.Actions, action) || !matchAny(x.Resources, resource) {
			continue
		}
		if x.Effect == "deny" {
			return effectDeny
		}
		out = effectAllow
	}
	return out
}

// matchAny reports whether s matches a pattern: "*", s itself, or a
// path.Match pattern.
func matchAny(patterns []string, s string) bool {
	for _, p := range patterns {
		if p == "*" || p == s {
			return true
		}
		if ok, _ := path.Match(p, s); ok {
			return true
		}
	}
	return false
}
