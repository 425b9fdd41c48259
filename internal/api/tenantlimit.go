package api

import (
	"context"
	"sync"
	"time"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
)

// DefaultTenantMutates is how many mutating calls of one tenant run at
// once by default (Config.TenantMutates; the [quotas] concurrent_mutates
// setting).
const DefaultTenantMutates = 4

// TenantQueueWait is how long a tenant's mutating call waits for one of
// its tenant's slots before it is refused RATE_LIMITED.
const TenantQueueWait = time.Second

// errTenantBusy answers a mutating call whose tenant already runs its
// limit of mutating calls.
var errTenantBusy = errs.New(errs.RateLimited, "too many mutating calls of this tenant at once")

// tenantLimiter bounds the mutating calls each tenant runs at once, so
// one tenant's parallel bulk calls hold at most a few database
// connections and transactions, and the others' calls get theirs.
type tenantLimiter struct {
	max   int
	wait  time.Duration
	mu    sync.Mutex
	slots map[string]chan struct{}
	users map[string]int // callers holding or waiting for a tenant's slots
}

// slotTenant is the tenant whose slots a call of tenant takes: its
// top-level tenant (the root tenant's direct child in chain, the tenant's
// chain from itself up to the root), or tenant itself when the chain does
// not reach the root (the root tenant, or a chain too deep to read whole).
func slotTenant(tenant string, chain []iam.Tenant) string {
	if n := len(chain); n >= 2 && chain[n-1].ID == iam.RootTenant {
		return chain[n-2].ID
	}
	return tenant
}

func newTenantLimiter(max int, wait time.Duration) *tenantLimiter {
	if max <= 0 {
		max = DefaultTenantMutates
	}
	return &tenantLimiter{max: max, wait: wait, slots: map[string]chan struct{}{}, users: map[string]int{}}
}

// admit takes one of tenant's slots for a mutating call, waiting up to the
// limiter's wait; it returns the release, or errTenantBusy. Reads pass.
func (l *tenantLimiter) admit(ctx context.Context, tenant string, mutates bool) (release func(), err error) {
	if !mutates {
		return func() {}, nil
	}
	l.mu.Lock()
	ch := l.slots[tenant]
	if ch == nil {
		ch = make(chan struct{}, l.max)
		l.slots[tenant] = ch
	}
	l.users[tenant]++
	l.mu.Unlock()
	leave := func() {
		l.mu.Lock()
		if l.users[tenant]--; l.users[tenant] == 0 {
			delete(l.users, tenant)
			delete(l.slots, tenant)
		}
		l.mu.Unlock()
	}
	held := func() { <-ch; leave() }
	select {
	case ch <- struct{}{}:
		return held, nil
	default:
	}
	if l.wait > 0 {
		t := time.NewTimer(l.wait)
		defer t.Stop()
		select {
		case ch <- struct{}{}:
			return held, nil
		case <-t.C:
		case <-ctx.Done():
		}
	}
	leave()
	return nil, errTenantBusy
}
