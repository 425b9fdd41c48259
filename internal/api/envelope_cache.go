package api

import (
	"context"
	"crypto/sha256"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/bettercompute/bettercompute/internal/apikeys"
	"github.com/bettercompute/bettercompute/internal/bus"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/iam"
)

// The caches' lifetimes and bound. An entry never outlives its TTL, so a
// change whose poke was lost is seen at the latest this long after.
const (
	// AuthCacheTTL is how long a credential's successful authentication
	// (its principal and its home tenant's chain and state) is kept.
	AuthCacheTTL = 30 * time.Second
	// DecisionCacheTTL is how long an allowed decision of a read method is
	// kept.
	DecisionCacheTTL = 10 * time.Second
	// AccessCacheSize bounds each cache's entries; a full cache drops its
	// expired entries, then everything.
	AccessCacheSize = 10000
)

// Liveness reports whether pokes from other processes are being received
// now (ok), and an epoch that changes whenever they may have been missed
// (the listener was down or silent): the access cache serves nothing
// while ok is false and drops everything when the epoch changes.
type Liveness func() (epoch uint64, ok bool)

// AccessCache keeps, per caller address, credentials' successful
// authentications (AuthCacheTTL) and allowed decisions of read methods
// with the tenant their resource resolved to (DecisionCacheTTL), so that
// a repeated call skips those database round trips. Refusals and
// mutating methods are never cached. Every change that can narrow access
// drops it (Drop, and bus.TopicAccessChanged through
// Server.CacheAccess); it serves only while that subscription runs and,
// across processes, while the poke listener is live. It is safe for
// concurrent use.
type AccessCache struct {
	clk clock.Clock
	max int

	mu sync.Mutex
	// on is set while the invalidation subscription runs.
	on    bool
	live  Liveness
	epoch uint64
	// gen changes at every drop: a result read under an older generation
	// is not stored, so a read that raced a change cannot outlive it.
	gen   uint64
	auth  map[string]authEntry
	allow map[string]allowEntry
}

// allowEntry is a cached allowed decision: the tenant the call acted in
// (its resource's tenant, as the resolver read it), until a time.
type allowEntry struct {
	tenant string
	until  time.Time
}

// authEntry is a cached authentication: the principal and its home
// tenant's chain (nil for root), until a time.
type authEntry struct {
	p     apikeys.Principal
	chain []iam.Tenant
	until time.Time
}

// NewAccessCache returns an empty cache on clk, which serves nothing until
// a Server's CacheAccess loop runs.
func NewAccessCache(clk clock.Clock) *AccessCache {
	return &AccessCache{clk: clk, max: AccessCacheSize, auth: map[string]authEntry{}, allow: map[string]allowEntry{}}
}

// Drop forgets every cached authentication and decision, and keeps any
// read already under way from storing its result.
func (a *AccessCache) Drop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.dropLocked()
}

func (a *AccessCache) dropLocked() {
	a.gen++
	clear(a.auth)
	clear(a.allow)
}

// usableLocked reports whether the cache may serve and store now: its
// subscription runs and, with a Liveness, pokes from other processes
// arrive; a new epoch drops everything first.
func (a *AccessCache) usableLocked() bool {
	if !a.on {
		return false
	}
	if a.live == nil {
		return true
	}
	epoch, ok := a.live()
	if !ok {
		return false
	}
	if epoch != a.epoch {
		a.dropLocked()
		a.epoch = epoch
	}
	return true
}

// generation returns the generation to store a result under, read before
// the database is; ok is false when the cache does not serve.
func (a *AccessCache) generation() (gen uint64, ok bool) {
	if a == nil {
		return 0, false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.gen, a.usableLocked()
}

func (a *AccessCache) getAuth(key string) (authEntry, bool) {
	if a == nil {
		return authEntry{}, false
	}
	now := a.clk.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.usableLocked() {
		return authEntry{}, false
	}
	e, ok := a.auth[key]
	if !ok || !now.Before(e.until) {
		delete(a.auth, key)
		return authEntry{}, false
	}
	return e, true
}

// putAuth keeps p and chain under key for AuthCacheTTL, never past the
// credential's own expiry, unless the cache dropped since gen.
func (a *AccessCache) putAuth(key string, gen uint64, p apikeys.Principal, chain []iam.Tenant) {
	now := a.clk.Now()
	until := now.Add(AuthCacheTTL)
	if !p.ExpiresAt.IsZero() && p.ExpiresAt.Before(until) {
		until = p.ExpiresAt
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	// usableLocked first: a listener that recovered since the read drops
	// the cache (a new generation), so the read is not stored.
	if !a.usableLocked() || gen != a.gen {
		return
	}
	if len(a.auth) >= a.max {
		for k, e := range a.auth {
			if !now.Before(e.until) {
				delete(a.auth, k)
			}
		}
		if len(a.auth) >= a.max {
			clear(a.auth)
		}
	}
	a.auth[key] = authEntry{p: p, chain: chain, until: until}
}

// allowed returns the tenant of the allowed decision cached under key;
// ok is false when none is (or the cache does not serve).
func (a *AccessCache) allowed(key string) (tenant string, ok bool) {
	if a == nil {
		return "", false
	}
	now := a.clk.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.usableLocked() {
		return "", false
	}
	e, ok := a.allow[key]
	if !ok || !now.Before(e.until) {
		delete(a.allow, key)
		return "", false
	}
	return e.tenant, true
}

// forget drops the decision cached under key (its resource is gone).
func (a *AccessCache) forget(key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.allow, key)
}

// putAllowed keeps an allowed decision, made in tenant, under key for
// DecisionCacheTTL, unless the cache dropped since gen.
func (a *AccessCache) putAllowed(key string, gen uint64, tenant string) {
	now := a.clk.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.usableLocked() || gen != a.gen {
		return
	}
	if len(a.allow) >= a.max {
		for k, e := range a.allow {
			if !now.Before(e.until) {
				delete(a.allow, k)
			}
		}
		if len(a.allow) >= a.max {
			clear(a.allow)
		}
	}
	a.allow[key] = allowEntry{tenant: tenant, until: now.Add(DecisionCacheTTL)}
}

// setOn starts or stops serving, with live as the liveness of pokes from
// other processes (nil: this process is the only one).
func (a *AccessCache) setOn(on bool, live Liveness) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.dropLocked()
	a.on, a.live = on, live
	if live != nil {
		a.epoch, _ = live()
	}
}

// CacheAccess has s serve authentications and allowed read decisions from
// cache, which is dropped on every poke of bus.TopicAccessChanged, from
// this process or from another one (bus.RemoteTopic). live, when set
// (PostgreSQL: other processes may change access), tells whether their
// pokes arrive; while they do not, nothing is served from cache. The cache
// serves only while the returned loop runs; call this before serving.
func (s *Server) CacheAccess(cache *AccessCache, b *bus.Bus, live Liveness) func(ctx context.Context) {
	local, stopLocal := b.Subscribe(bus.TopicAccessChanged)
	remote, stopRemote := b.Subscribe(bus.RemoteTopic(bus.TopicAccessChanged))
	s.access = cache
	return func(ctx context.Context) {
		defer stopLocal()
		defer stopRemote()
		cache.setOn(true, live)
		defer cache.setOn(false, nil)
		for {
			select {
			case <-ctx.Done():
				return
			case <-local:
				cache.Drop()
			case <-remote:
				cache.Drop()
			}
		}
	}
}

// authCacheKey is the cache key of the credential r presents from addr,
// or "" when r is not one the cache may answer for: a bearer key, or a
// session cookie that passes authenticate's Origin check. Only a digest
// of the credential is kept.
func (s *Server) authCacheKey(r *http.Request, addr string) string {
	cred := ""
	if authz := r.Header.Get("Authorization"); authz != "" {
		key, ok := strings.CutPrefix(authz, "Bearer ")
		if !ok {
			return ""
		}
		cred = "bearer\x00" + key
	} else {
		ck, err := r.Cookie(SessionCookie)
		if err != nil || !s.cfg.SessionCookies || s.origin == "" || r.Header.Get("Origin") != s.origin {
			return ""
		}
		cred = "session\x00" + ck.Value
	}
	sum := sha256.Sum256([]byte(cred))
	return string(sum[:]) + "\x00" + addr
}

// decisionCacheKey keys an allowed decision by the caller (identity and
// credential), its address, the action, the resource and whether the
// resource was resolved (kind, "" for a tenant the input names: "tenant/X"
// then acts in X, a resolved tenant X in its parent). The tenant the call
// acts in follows from these and is kept in the entry: a hit spares the
// resolver's read too.
func decisionCacheKey(c *Caller, action, kind, resource string) string {
	return strings.Join([]string{c.Identity, c.KeyID, c.SessionID, c.Addr, action, kind, resource}, "\x00")
}
