package api

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
)

// call is one request as it passes the envelope's stages: each stage
// reads what the ones before it set and sets what the ones after it need.
type call struct {
	r     *http.Request
	ctx   context.Context
	m     Method
	known bool
	c     *Caller
	out   outcome

	raw    []byte
	in     any
	target Target
	// callerChain is the caller's home tenant's chain (nil for root).
	callerChain []iam.Tenant
	// chain is the chain of the tenant the call acts in, and resource the
	// "<type>/<id>" path the method's action is decided on.
	chain    []iam.Tenant
	resource string
	// cached is what the access cache knows of the call
	// (envelope_cached.go).
	cached cachedCall
}

// serve runs the envelope's stages in order, each refusing with its own
// code: authenticate (CSRF, failed-attempt limit, credential, the
// identity's rate limit), pre-check (method, body, input, tenant
// pre-check, the caller's tenant state), limit (the top-level tenant's
// mutation slots), scope (the tenant the call acts in and the resource),
// decide (IAM), and the idempotent run.
func (s *Server) serve(r *http.Request, rid string, m Method, known bool) (answer, outcome) {
	q := &call{r: r, ctx: r.Context(), m: m, known: known,
		c: &Caller{RequestID: rid, Addr: s.cfg.TrustedProxies.ClientAddr(r)}}
	if err := s.authenticateCall(q); err != nil {
		return s.errorAnswer(rid, err), q.out
	}
	if err := s.preCheck(q); err != nil {
		return s.errorAnswer(rid, err), q.out
	}
	release, err := s.limit(q)
	if err != nil {
		return s.errorAnswer(rid, err), q.out
	}
	defer release()
	if err := s.scope(q); err != nil {
		return s.errorAnswer(rid, err), q.out
	}
	if err := s.decide(q); err != nil {
		return s.errorAnswer(rid, err), q.out
	}
	if err := s.confirm(q); err != nil {
		return s.errorAnswer(rid, err), q.out
	}
	if err := s.moduleLimit(q); err != nil {
		return s.errorAnswer(rid, err), q.out
	}
	return s.runIdempotent(q), q.out
}

// authenticateCall is the first stage. Authentication comes before the
// method lookup and the body: an unauthenticated caller learns neither
// which methods exist nor what their inputs look like. Failed attempts
// are limited per address, and every authenticated call spends a token of
// its identity before the method lookup and the body, so unknown methods,
// malformed bodies and pre-check refusals are limited like the rest.
func (s *Server) authenticateCall(q *call) error {
	r := q.r
	if r.Method != http.MethodPost || !isJSON(r.Header.Get("Content-Type")) || r.Header.Get("X-Better-Compute") != "1" {
		return errs.New(errs.CSRFRejected, "POST with content-type application/json and X-Better-Compute: 1 is required")
	}
	return s.authenticateCaller(q)
}

// authenticateCaller is authenticateCall past its request-shape check
// (the upload endpoint checks its own shape, then this).
func (s *Server) authenticateCaller(q *call) error {
	c := q.c
	if wait := s.authFailures.blocked(c.Addr); wait > 0 {
		q.out.retryAfter = wait
		return errs.New(errs.RateLimited, "too many failed authentications")
	}
	p, err := s.authenticateCached(q)
	if err != nil {
		if errs.CodeOf(err) == errs.Unauthenticated {
			s.authFailures.fail(c.Addr)
		}
		return err
	}
	c.Principal = p
	if wait := s.limiter.take(c.Identity, q.known && q.m.Mutates); wait > 0 {
		q.out.retryAfter = wait
		return errs.New(errs.RateLimited, "too many requests")
	}
	return nil
}

// moduleLimit is the decided call's module limit per identity
// (Method.LimitedPerIdentity), before the method runs.
func (s *Server) moduleLimit(q *call) error {
	if q.m.perIdentity == nil {
		return nil
	}
	if wait := q.m.perIdentity.Take(q.c.Identity); wait > 0 {
		q.out.retryAfter = wait
		return errs.New(errs.RateLimited, q.m.limitMsg)
	}
	return nil
}

// preCheck is the second stage: the method must exist, the body fit and
// decode strictly, and the tenant the input names be within the caller's
// reach; then the caller's own tenant must be live (not deleted, and not
// suspended for a mutation).
//
// The tenant pre-check: a caller outside root naming a tenant outside its
// own subtree is denied after reading at most the tenant tree (nothing
// for its own tenant): no IAM decision, policy or resource read; only the
// denial row, in the caller's own tenant, is written.
func (s *Server) preCheck(q *call) error {
	if !q.known {
		return errs.New(errs.NotFound, "no such method")
	}
	raw, err := io.ReadAll(io.LimitReader(q.r.Body, MaxBody+1))
	if err != nil {
		return errs.Wrap(errs.InvalidInput, "the body could not be read", err)
	}
	if len(raw) > MaxBody {
		return errs.New(errs.PayloadTooLarge, "the body is larger than 64 KiB")
	}
	if q.in, q.target, err = q.m.decode(raw); err != nil {
		return err
	}
	q.raw = raw
	c, t := q.c, q.target
	if t.Tenant != "" && !c.Root() && t.Tenant != c.HomeTenant && !s.reaches(q.ctx, c, t.Tenant) {
		s.recordDenial(q.ctx, c, q.m, t, "tenant-precheck")
		return denied(c, q.m.Action, t)
	}
	return s.callerState(q)
}

// callerState is preCheck's last step: the caller's own tenant must be
// live (not deleted, and not suspended for a mutation). Its chain comes
// with a cached authentication; one read here is stored with it.
func (s *Server) callerState(q *call) (err error) {
	c := q.c
	if !c.Root() && !q.cached.authHit {
		if q.callerChain, err = s.deps.IAM.Chain(q.ctx, c.HomeTenant); err != nil {
			return err
		}
	}
	if c.Root() {
		s.rememberAuth(q)
		return nil
	}
	if err := tenantState(iam.EffectiveState(q.callerChain), q.m.Mutates); err != nil {
		return err
	}
	s.rememberAuth(q)
	return nil
}

// tenantState refuses a call in a deleted tenant, or a mutation in a
// suspended one (TENANT_SUSPENDED).
func tenantState(st string, mutates bool) error {
	if st == iam.StateDeleted || st == iam.StateSuspended && mutates {
		return errs.New(errs.TenantSuspended, "the tenant is "+st)
	}
	return nil
}

// limit is the third stage: one top-level tenant's mutations (its own and
// every tenant's under it) hold at most a few of the process's slots at
// once, so work it starts cannot hold the database from the others, and
// child tenants are no way to more slots. It returns the slot's release.
func (s *Server) limit(q *call) (release func(), err error) {
	release, err = s.tenants.admit(q.ctx, slotTenant(q.c.HomeTenant, q.callerChain), q.m.Mutates)
	if err != nil {
		q.out.retryAfter = time.Second
		return nil, err
	}
	return release, nil
}

// scope is the fourth stage: it sets the tenant the call acts in (the
// input's tenant, else the caller's home tenant, then the named
// resource's tenant), refusing a resource that does not exist or is
// outside the caller's reach as the same denial, and reads that tenant's
// chain, which must be live for a caller acting below its own tenant. A
// read whose allowed decision is cached takes the tenant from the cache
// (allowedCached); a resource deleted since is then refused after the
// method, by goneSinceCached, with the same answer.
func (s *Server) scope(q *call) error {
	c, t := q.c, q.target
	c.ActingTenant = t.Tenant
	if c.ActingTenant == "" {
		c.ActingTenant = c.HomeTenant
	}
	q.resource = "tenant/" + c.ActingTenant
	if t.Kind != "" {
		q.resource = t.Kind + "/" + t.ID
	}
	if tenant, hit := s.allowedCached(q); hit {
		c.ActingTenant = tenant
	} else if t.Kind != "" {
		tenant, err := s.resolve(q)
		if err != nil {
			return err
		}
		c.ActingTenant = tenant
	}
	q.chain = q.callerChain
	if c.ActingTenant != c.HomeTenant || q.chain == nil {
		var err error
		if q.chain, err = s.deps.IAM.Chain(q.ctx, c.ActingTenant); err != nil {
			return err
		}
	}
	if len(q.chain) == 0 && c.Root() {
		// Only root reaches here with a tenant that does not exist (the
		// pre-check denied anyone else one outside its reach): as for its
		// missing resources, it is told so.
		return errs.New(errs.NotFound, "tenant not found")
	}
	return actingState(c, q.chain, q.m.Mutates)
}

// resolve returns the tenant of the resource the input names. A missing
// resource is NOT_FOUND for a root caller and, like another tenant's
// resource, the one denial for anyone else.
func (s *Server) resolve(q *call) (string, error) {
	c, t := q.c, q.target
	resolve := s.deps.Resolvers[t.Kind]
	if resolve == nil {
		return "", fmt.Errorf("api: no resolver for %q", t.Kind)
	}
	var tenant string
	var err error
	if possibleID(t.ID) {
		tenant, err = resolve(q.ctx, t.ID)
	} else {
		// No resource has such an id (a query string's, which no decoder
		// checked): it is missing, and named in the denial row and the log
		// by malformedID, never by the caller's bytes. The database never
		// sees it (PostgreSQL refuses NUL and bytes that are not UTF-8 in
		// text, which would answer 500 there and a denial on SQLite).
		q.target.ID = malformedID
		err = errs.New(errs.NotFound, t.Kind+" not found")
	}
	switch {
	case errs.CodeOf(err) == errs.NotFound:
		if !c.Root() {
			// The tenant-tree read another tenant's resource costs (reaches
			// reads its chain), made for a missing one too, of the caller's
			// own chain: the two take about the same time.
			_, _ = s.deps.IAM.Chain(q.ctx, c.HomeTenant)
		}
		return "", s.missing(q)
	case err != nil:
		return "", err
	case !c.Root() && tenant != c.HomeTenant && !s.reaches(q.ctx, c, tenant):
		s.outOfReach(q, "other-tenant")
		return "", denied(c, q.m.Action, t)
	}
	return tenant, nil
}

// malformedID stands, in denial rows and the log, for an id no resource
// can have: its parentheses are in no id's alphabet.
const malformedID = "(malformed)"

// possibleID reports whether id could name a resource: UTF-8 without NUL,
// as every id the control plane makes is, and as the database can hold.
func possibleID(id string) bool {
	return utf8.ValidString(id) && strings.IndexByte(id, 0) < 0
}

// missing is the answer to a call whose resource does not exist:
// NOT_FOUND for a root caller and, like another tenant's resource, the one
// denial (recorded) for anyone else.
func (s *Server) missing(q *call) error {
	c, t := q.c, q.target
	if c.Root() {
		return errs.New(errs.NotFound, t.Kind+" not found")
	}
	s.outOfReach(q, "not-found")
	return denied(c, q.m.Action, t)
}

// ReasonOutOfReach is the reason the audit row of a denial gives for a
// resource that is missing or another tenant's: the caller's tenant reads
// its own audit log, so the row must not say which (an existence oracle);
// the operator's log does.
const ReasonOutOfReach = "out-of-reach"

// outOfReach records the denial of a call whose resource is missing or
// another tenant's (why): one reason in the caller's audit log, why in the
// operator's.
func (s *Server) outOfReach(q *call, why string) {
	s.deps.Log.Info("resource out of reach", "request_id", q.c.RequestID, "resource", q.target.Kind+"/"+q.target.ID, "why", why)
	s.recordDenial(q.ctx, q.c, q.m, q.target, ReasonOutOfReach)
}

// decide is the fifth stage: IAM decides the method's action on the
// resource in the acting tenant's chain under the caller's scopes (an
// allowed read from the access cache, decideCached); a refusal is
// recorded. It then gives the caller the decider of further
// actions (Caller.Allowed), recorded the same way.
func (s *Server) decide(q *call) error {
	c, m, chain := q.c, q.m, q.chain
	ok, err := s.decideCached(q)
	if err != nil {
		return err
	}
	if !ok {
		s.recordDenial(q.ctx, c, m, q.target, "policy")
		if err := s.agentDenied(q.ctx, c, m.Action); err != nil {
			return err
		}
		return denied(c, m.Action, q.target)
	}
	c.allow = func(ctx context.Context, action, resource string) (bool, error) {
		ok, err := s.deps.IAM.Decide(ctx, c.Identity, action, resource, chain, c.Scopes)
		if err == nil && !ok {
			kind, id, _ := strings.Cut(resource, "/")
			further := m
			further.Action = action
			s.recordDenial(ctx, c, further, Target{Tenant: c.ActingTenant, Kind: kind, ID: id}, "policy")
		}
		return ok, err
	}
	return nil
}

// runIdempotent is the last stage: the handler runs, under the caller's
// Idempotency-Key when a mutation carries one.
func (s *Server) runIdempotent(q *call) answer {
	run := func() answer {
		res, err := q.m.run(q.ctx, q.c, q.in)
		return s.answerOf(q.c, res, s.goneSinceCached(q, err))
	}
	if key := q.r.Header.Get("Idempotency-Key"); q.m.Mutates && key != "" {
		return s.idempotent(q.ctx, q.c, q.m, key, q.raw, run)
	}
	return run()
}
