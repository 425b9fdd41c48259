// Package ratelimit is a token bucket per key (an identity), in memory,
// for the limits a module enforces on top of the API envelope's own:
// 10 tunnels a minute and 20 break-glass certificates an hour per
// identity. The buckets are golang.org/x/time/rate limiters read at an
// injected clock's time, so a test moves time instead of sleeping.
//
// The limits are per process (per api replica), as the design says; a
// deployment with N replicas lets an identity N times the rate at most.
package ratelimit

import (
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/bettercompute/bettercompute/internal/clock"
)

// maxKeys bounds the buckets kept; past it, full buckets are forgotten
// (a forgotten bucket is a full one, so nothing is let through early).
const maxKeys = 100000

// PerKey allows Burst events at once per key, refilled evenly to Burst
// over Per.
type PerKey struct {
	every rate.Limit
	burst int
	clk   clock.Clock

	mu   sync.Mutex
	keys map[string]*rate.Limiter
}

// New allows n events per period per key (n at once, refilled evenly).
func New(clk clock.Clock, n int, per time.Duration) *PerKey {
	return &PerKey{every: rate.Limit(float64(n) / per.Seconds()), burst: n, clk: clk, keys: map[string]*rate.Limiter{}}
}

// Take spends one event of key. It returns 0 when allowed, or how long
// until one event is available (nothing is spent then).
func (p *PerKey) Take(key string) time.Duration {
	now := p.clk.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.keys[key]
	if l == nil {
		if len(p.keys) >= maxKeys {
			p.forgetFull(now)
		}
		l = rate.NewLimiter(p.every, p.burst)
		p.keys[key] = l
	}
	if l.AllowN(now, 1) {
		return 0
	}
	wait := time.Duration((1 - l.TokensAt(now)) / float64(p.every) * float64(time.Second))
	return max(wait, time.Second)
}

// forgetFull drops the buckets that are full at now.
func (p *PerKey) forgetFull(now time.Time) {
	for k, l := range p.keys {
		if l.TokensAt(now) >= float64(p.burst) {
			delete(p.keys, k)
		}
	}
}
