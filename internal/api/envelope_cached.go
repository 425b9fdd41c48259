package api

import (
	"github.com/bettercompute/bettercompute/internal/apikeys"
	"github.com/bettercompute/bettercompute/internal/errs"
)

// cachedCall is what the access cache (AccessCache) knows of one call:
// the generation its reads run under, whether the cache serves, the
// credential's cache key and the decision's, and what came from the cache.
type cachedCall struct {
	// on is set when the cache served at the call's start; gen is its
	// generation then. A result is stored only under that generation.
	on  bool
	gen uint64
	// authKey is the credential's cache key ("" when not cacheable), and
	// authHit is set when its authentication came from the cache (with
	// the home tenant's chain in call.callerChain).
	authKey string
	authHit bool
	// decisionKey is the call's decision cache key ("" when not
	// cacheable), and allowHit is set when its allowed decision, with its
	// tenant, came from the cache.
	decisionKey string
	allowHit    bool
}

// authenticateCached is authenticate, answered from the access cache when
// the credential's authentication from the caller's address is cached
// (the cached home chain then spares callerState its read). On a miss,
// callerState stores the result once the home chain is read.
func (s *Server) authenticateCached(q *call) (apikeys.Principal, error) {
	q.cached.gen, q.cached.on = s.access.generation()
	if q.cached.on {
		q.cached.authKey = s.authCacheKey(q.r, q.c.Addr)
	}
	if q.cached.authKey != "" {
		if e, hit := s.access.getAuth(q.cached.authKey); hit {
			q.callerChain, q.cached.authHit = e.chain, true
			return e.p, nil
		}
	}
	return s.authenticate(q.ctx, q.r)
}

// rememberAuth stores the call's authentication and home chain, read from
// the database, in the access cache (nothing when it came from there, or
// the cache dropped since the call began).
func (s *Server) rememberAuth(q *call) {
	if !q.cached.on || q.cached.authHit || q.cached.authKey == "" {
		return
	}
	s.access.putAuth(q.cached.authKey, q.cached.gen, q.c.Principal, q.callerChain)
}

// allowedCached returns, for a read method whose allowed decision for
// this caller, address, action and resource is cached, the tenant the
// call acted in then; the scope stage then skips the resolver's read, and
// decideCached the decision's. Resource ids are never reused and a
// resource never changes tenant, so the tenant can only be stale for a
// resource deleted since (goneSinceCached).
func (s *Server) allowedCached(q *call) (string, bool) {
	if !q.cached.on || q.m.Mutates {
		return "", false
	}
	q.cached.decisionKey = decisionCacheKey(q.c, q.m.Action, q.target.Kind, q.resource)
	tenant, hit := s.access.allowed(q.cached.decisionKey)
	q.cached.allowHit = hit
	return tenant, hit
}

// decideCached is IAM's decision of the call's own action, answered from
// the access cache when allowedCached found it. Only an allowed decision
// of a method that does not mutate is stored, with the tenant it was made
// in: a refusal, and any decision of a mutating method, is decided afresh
// every time.
func (s *Server) decideCached(q *call) (bool, error) {
	c, m := q.c, q.m
	if q.cached.allowHit {
		return true, nil
	}
	ok, err := s.deps.IAM.Decide(q.ctx, c.Identity, m.Action, q.resource, q.chain, c.Scopes)
	if err == nil && ok && q.cached.decisionKey != "" {
		s.access.putAllowed(q.cached.decisionKey, q.cached.gen, c.ActingTenant)
	}
	return ok, err
}

// goneSinceCached is the answer to a method that returned err after its
// resource's tenant came from the cache: when the method answered
// NOT_FOUND and the resolver now finds no such resource, the resolver's
// missing-resource answer (missing), with the entry forgotten, so a
// resource deleted since its decision was cached answers exactly as one
// that never existed. A NOT_FOUND of the method's own about a resource
// that still exists (something else it names) is kept, as without the
// cache.
func (s *Server) goneSinceCached(q *call, err error) error {
	if err == nil || !q.cached.allowHit || q.target.Kind == "" || errs.CodeOf(err) != errs.NotFound {
		return err
	}
	if _, rerr := s.deps.Resolvers[q.target.Kind](q.ctx, q.target.ID); errs.CodeOf(rerr) != errs.NotFound {
		return err
	}
	s.access.forget(q.cached.decisionKey)
	return s.missing(q)
}
