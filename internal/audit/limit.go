package audit

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// refusalLimiter bounds the refusal rows written per key (type and
// reason): a token bucket per key (golang.org/x/time/rate) of burst rows
// refilled at burst per window, so a flood of bad requests cannot fill
// the database. It counts what it suppressed since a key's last allowed
// row, for that row to carry.
type refusalLimiter struct {
	every rate.Limit
	burst int

	mu   sync.Mutex
	keys map[string]*refusalBucket
}

type refusalBucket struct {
	lim        *rate.Limiter
	suppressed int
}

// newRefusalLimiter lets burst rows per window through for each key.
func newRefusalLimiter(burst int, window time.Duration) *refusalLimiter {
	return &refusalLimiter{every: rate.Every(window / time.Duration(burst)), burst: burst, keys: map[string]*refusalBucket{}}
}

// allow reports whether a row of key may be written at now and, when it
// may, how many rows of key were suppressed before it (the count starts
// again from zero).
func (l *refusalLimiter) allow(key string, now time.Time) (ok bool, suppressedBefore int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.keys[key]
	if b == nil {
		b = &refusalBucket{lim: rate.NewLimiter(l.every, l.burst)}
		l.keys[key] = b
	}
	if !b.lim.AllowN(now, 1) {
		b.suppressed++
		return false, 0
	}
	n := b.suppressed
	b.suppressed = 0
	return true, n
}
