package idempotency

import (
	"crypto/hmac"
	"time"
)

// verdict is what a request does with a key another request already holds.
type verdict int

const (
	// replay answers the stored answer of the same request.
	replay verdict = iota
	// expired forgets the row (older than TTL and not running) and takes
	// the key as new.
	expired
	// otherRequest refuses the key: it was used with another body.
	otherRequest
	// running refuses the key: the same request is still running.
	running
	// takeOver takes the key from a request whose lease ran out (its
	// process died) and runs it.
	takeOver
	// shownOnce refuses the replay of an answer that carried a credential.
	shownOnce
)

// decide is the rule for a request that finds its key taken, from the row
// read, the request's digest, the time and whether its answer carries a
// credential. It reads nothing and writes nothing.
func decide(r row, digest []byte, now time.Time, credential bool) verdict {
	leaseOver := now.UnixMilli() >= r.lease
	if r.created <= now.Add(-TTL).UnixMilli() && (r.status != 0 || leaseOver) {
		return expired
	}
	switch {
	case !hmac.Equal(r.digest, digest):
		return otherRequest
	case r.status == 0 && !leaseOver:
		return running
	case r.status == 0:
		return takeOver
	case credential:
		return shownOnce
	}
	return replay
}
