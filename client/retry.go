package client

import (
	"context"
	"errors"
	"time"
)

// Retry bounds how the client sends a call again after a RATE_LIMITED
// answer, the only answer it retries. The API refuses RATE_LIMITED in its
// envelope before the method runs (the identity's token bucket, the
// failed-authentication limit and the tenant's mutation slots all come
// before the handler: internal/api/envelope.go), so sending a mutation
// again cannot apply it twice; a mutation with an Idempotency-Key is sent
// again with the same key.
type Retry struct {
	// MaxTries is how many times a call is sent at most, the first
	// included (0: DefaultRetry's; 1: never again).
	MaxTries int
	// MaxWait caps the time spent waiting over all of a call's retries
	// (0: DefaultRetry's): a Retry-After that would pass it ends the call
	// with the RATE_LIMITED error instead.
	MaxWait time.Duration
	// Sleep waits d or until ctx ends (nil: a real timer). Tests give a
	// fake that records d and returns at once.
	Sleep func(ctx context.Context, d time.Duration) error
}

// DefaultRetry sends a call at most 5 times and waits at most 30 s in all.
var DefaultRetry = Retry{MaxTries: 5, MaxWait: 30 * time.Second}

// minRetryWait is the wait when the answer names none (or 0 s).
const minRetryWait = time.Second

// sleepCtx waits d on a real timer, or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// withRetry runs send until it returns something other than RATE_LIMITED,
// the tries are spent, or the next wait would pass the total cap.
func (r Retry) withRetry(ctx context.Context, send func() error) error {
	tries, capWait, sleep := r.MaxTries, r.MaxWait, r.Sleep
	if tries <= 0 {
		tries = DefaultRetry.MaxTries
	}
	if capWait <= 0 {
		capWait = DefaultRetry.MaxWait
	}
	if sleep == nil {
		sleep = sleepCtx
	}
	var waited time.Duration
	for try := 1; ; try++ {
		err := send()
		wait, ok := retryAfter(err)
		if !ok || try >= tries || waited+wait > capWait {
			return err
		}
		if serr := sleep(ctx, wait); serr != nil {
			return err
		}
		waited += wait
	}
}

// retryAfter reports whether err is a RATE_LIMITED answer, and how long to
// wait before sending the call again.
func retryAfter(err error) (time.Duration, bool) {
	var e *Error
	if !errors.As(err, &e) || e.Code != ErrRateLimited.Code {
		return 0, false
	}
	return max(e.RetryAfter, minRetryWait), true
}
