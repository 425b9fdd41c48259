package api

import (
	"net/http"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/apikeys"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/iam"
)

// onCache returns a serving cache on a fake clock (as CacheAccess's loop
// turns it on) with live as its liveness.
func onCache(live Liveness) (*AccessCache, *clock.Fake) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	a := NewAccessCache(clk)
	a.setOn(true, live)
	return a, clk
}

// TestAccessCacheTTL: an authentication is kept AuthCacheTTL (never past
// the credential's expiry), an allowed decision DecisionCacheTTL, by the
// injected clock.
func TestAccessCacheTTL(t *testing.T) {
	a, clk := onCache(nil)
	gen, ok := a.generation()
	if !ok {
		t.Fatal("a cache turned on does not serve")
	}
	chain := []iam.Tenant{{ID: "t1", State: iam.StateActive}}
	a.putAuth("k", gen, apikeys.Principal{Identity: "i1", HomeTenant: "t1"}, chain)
	a.putAuth("short", gen, apikeys.Principal{Identity: "i2", ExpiresAt: clk.Now().Add(5 * time.Second)}, nil)
	a.putAllowed("d", gen, "t")
	clk.Advance(DecisionCacheTTL - time.Millisecond)
	if !isAllowed(a, "d") {
		t.Fatal("decision gone before its TTL")
	}
	if e, hit := a.getAuth("k"); !hit || e.p.Identity != "i1" || len(e.chain) != 1 {
		t.Fatalf("authentication: %+v %v", e, hit)
	}
	if _, hit := a.getAuth("short"); hit {
		t.Fatal("an authentication outlived its credential's expiry")
	}
	clk.Advance(time.Millisecond)
	if isAllowed(a, "d") {
		t.Fatal("decision kept past DecisionCacheTTL")
	}
	clk.Advance(AuthCacheTTL - DecisionCacheTTL - time.Millisecond)
	if _, hit := a.getAuth("k"); !hit {
		t.Fatal("authentication gone before its TTL")
	}
	clk.Advance(time.Millisecond)
	if _, hit := a.getAuth("k"); hit {
		t.Fatal("authentication kept past AuthCacheTTL")
	}
}

// TestAccessCacheDropAndGeneration: Drop forgets everything, and a result
// read before a drop is not stored after it.
func TestAccessCacheDropAndGeneration(t *testing.T) {
	a, _ := onCache(nil)
	gen, _ := a.generation()
	a.putAllowed("d", gen, "t")
	a.putAuth("k", gen, apikeys.Principal{Identity: "i"}, nil)
	a.Drop()
	if isAllowed(a, "d") {
		t.Fatal("decision served after Drop")
	}
	if _, hit := a.getAuth("k"); hit {
		t.Fatal("authentication served after Drop")
	}
	putBoth(a, "late", gen)
	refusesBoth(t, a, "late", "read before the drop was stored after it")
}

// TestAccessCacheFailsClosed: a cache whose subscription does not run, or
// whose poke listener is not live, serves and stores nothing; a new
// listener epoch (pokes may have been missed) drops everything.
func TestAccessCacheFailsClosed(t *testing.T) {
	off := NewAccessCache(clock.NewFake(time.Unix(0, 0)))
	if _, ok := off.generation(); ok {
		t.Fatal("a cache never turned on serves")
	}
	var nilCache *AccessCache
	if _, ok := nilCache.generation(); ok || isAllowed(nilCache, "d") {
		t.Fatal("no cache serves")
	}
	epoch, live := uint64(1), true
	a, _ := onCache(func() (uint64, bool) { return epoch, live })
	gen, _ := a.generation()
	a.putAllowed("d", gen, "t")
	a.putAuth("k", gen, apikeys.Principal{Identity: "i"}, nil)
	live = false
	if isAllowed(a, "d") {
		t.Fatal("decision served while the poke listener is down")
	}
	if _, hit := a.getAuth("k"); hit {
		t.Fatal("authentication served while the poke listener is down")
	}
	if _, ok := a.generation(); ok {
		t.Fatal("the cache serves while the poke listener is down")
	}
	live = true
	if !isAllowed(a, "d") {
		t.Fatal("decision lost while the listener stayed in one epoch")
	}
	epoch = 2
	if isAllowed(a, "d") {
		t.Fatal("decision served across a new listener epoch")
	}
	// A read made before the listener's new epoch (it may have missed a
	// change during the outage) is not stored after it, even when its
	// put is the first thing the cache sees in the new epoch.
	gen, _ = a.generation()
	epoch = 3
	putBoth(a, "stale", gen)
	refusesBoth(t, a, "stale", "read before the listener's new epoch was stored")
	a.setOn(false, nil)
	if _, ok := a.generation(); ok {
		t.Fatal("the cache serves after its subscription ended")
	}
}

// TestAccessCacheBounded: neither cache grows past its bound.
func TestAccessCacheBounded(t *testing.T) {
	a, _ := onCache(nil)
	a.max = 8
	gen, _ := a.generation()
	for i := 0; i < 100; i++ {
		k := string(rune('a' + i))
		a.putAllowed(k, gen, "t")
		a.putAuth(k, gen, apikeys.Principal{}, nil)
		if len(a.allow) > a.max || len(a.auth) > a.max {
			t.Fatalf("%d decisions, %d authentications, bound %d", len(a.allow), len(a.auth), a.max)
		}
	}
}

// TestAuthCacheKeyPerAddress: the same credential from another address,
// or over another kind, is another entry; a cookie without this
// deployment's Origin is not cacheable.
func TestAuthCacheKeyPerAddress(t *testing.T) {
	s := &Server{cfg: Config{SessionCookies: true}, origin: "https://bc.example"}
	bearer := func() *http.Request {
		r, _ := http.NewRequest(http.MethodPost, "/", nil)
		r.Header.Set("Authorization", "Bearer bck_x_y")
		return r
	}
	k1, k2 := s.authCacheKey(bearer(), "10.0.0.1"), s.authCacheKey(bearer(), "10.0.0.2")
	if k1 == "" || k1 == k2 {
		t.Fatalf("keys per address: %q %q", k1, k2)
	}
	cookie, _ := http.NewRequest(http.MethodPost, "/", nil)
	cookie.AddCookie(&http.Cookie{Name: SessionCookie, Value: "bck_x_y"})
	if k := s.authCacheKey(cookie, "10.0.0.1"); k != "" {
		t.Fatal("a cookie without an Origin is cacheable")
	}
	cookie.Header.Set("Origin", "https://bc.example")
	if k := s.authCacheKey(cookie, "10.0.0.1"); k == "" || k == k1 {
		t.Fatalf("session key %q, bearer key %q", k, k1)
	}
	c := &Caller{Principal: apikeys.Principal{Identity: "i", KeyID: "k"}, Addr: "10.0.0.1", ActingTenant: "t"}
	d1 := decisionCacheKey(c, "compute:nodes:get", "node", "node/n")
	c.Addr = "10.0.0.2"
	if d1 == decisionCacheKey(c, "compute:nodes:get", "node", "node/n") {
		t.Fatal("a decision is shared across caller addresses")
	}
}

// putBoth stores an allowed decision and an authentication under key,
// both read at generation gen.
func putBoth(a *AccessCache, key string, gen uint64) {
	a.putAllowed(key, gen, "t")
	a.putAuth(key, gen, apikeys.Principal{Identity: "i"}, nil)
}

// refusesBoth fails the test when a serves the decision or the
// authentication under key; what says why neither may be served.
func refusesBoth(t *testing.T, a *AccessCache, key, what string) {
	t.Helper()
	if isAllowed(a, key) {
		t.Fatal("a decision " + what)
	}
	if _, hit := a.getAuth(key); hit {
		t.Fatal("an authentication " + what)
	}
}

// isAllowed reports whether a serves an allowed decision under key.
func isAllowed(a *AccessCache, key string) bool {
	_, ok := a.allowed(key)
	return ok
}
