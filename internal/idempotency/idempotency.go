// Package idempotency remembers the answers of mutating API calls made
// with an Idempotency-Key, and owns the idempotency table. The first call
// with a (tenant, identity, key) runs and its answer is kept; the same key
// with the same method and body replays that answer; the same key with
// another request is refused (CONFLICT), and so is one still running.
//
// What is stored is no credential and no guessing oracle: the request is
// kept only as a keyed digest (HMAC-SHA256 under a key derived from the
// KEK), a 5xx answer is not kept (a retry runs again), and the answer of a
// call that carries a credential (ShownOnce) is never stored: its replay
// answers CONFLICT (ErrShownOnce). Keys are forgotten after TTL; a running
// request holds its key under a lease it renews, so a key whose process
// died is released when the lease runs out.
package idempotency

import (
	"context"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/store"
)

// Bounds: a key is remembered for TTL (then swept, and a key older than
// that is treated as new); a request in progress holds its key under a
// lease of Lease, renewed every Renew while it runs.
const (
	TTL   = 24 * time.Hour
	Lease = 2 * time.Minute
	Renew = 30 * time.Second
)

// The refusals, exactly as the API answers them.
var (
	// ErrBadKey refuses a malformed Idempotency-Key.
	ErrBadKey = errs.New(errs.InvalidInput, "Idempotency-Key: 1 to 128 of A-Z a-z 0-9 . _ : -")
	// ErrOtherRequest refuses a key used before with another request.
	ErrOtherRequest = errs.New(errs.Conflict, "Idempotency-Key was used with another request")
	// ErrRunning refuses a key whose request is still running.
	ErrRunning = errs.New(errs.Conflict, "a request with this Idempotency-Key is still running")
	// ErrShownOnce answers a replay of a call whose first answer carried a
	// credential: the credential was shown once and is not kept, so it
	// cannot be shown again.
	ErrShownOnce = errs.New(errs.Conflict, "a request with this Idempotency-Key already ran; its answer carried a credential, which is shown once and not replayed")
)

var keyRE = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)

// ValidKey reports whether key is a well-formed Idempotency-Key.
func ValidKey(key string) bool { return len(key) <= 128 && keyRE.MatchString(key) }

// DeriveKey derives the key of the stored digests from the KEK (HKDF-SHA256,
// info "bc-idempotency-v1").
func DeriveKey(kek []byte) []byte {
	k, err := hkdf.Key(sha256.New, kek, nil, "bc-idempotency-v1", sha256.Size)
	if err != nil {
		// hkdf.Key fails only for an output longer than 255 hashes.
		panic("idempotency: derive key: " + err.Error())
	}
	return k
}

// Call is one keyed request.
type Call struct {
	// Tenant and Identity are the caller's home tenant and identity: a key
	// is the caller's own, whatever tenant the call acts in.
	Tenant, Identity string
	Key              string
	Method           string
	Body             []byte
	// ShownOnce marks a call whose answer carries a credential.
	ShownOnce bool
	// RequestID names the request in logs.
	RequestID string
}

// Answer is a finished answer: its HTTP status and body.
type Answer struct {
	Status int
	Body   []byte
}

// Store is the idempotency table.
type Store struct {
	db  *store.DB
	clk clock.Clock
	key []byte
	log *slog.Logger
}

// New returns the store over db; key keys the stored digests (DeriveKey).
func New(db *store.DB, clk clock.Clock, key []byte, log *slog.Logger) *Store {
	return &Store{db: db, clk: clk, key: key, log: log}
}

// digest is the keyed digest of a call's method and body.
func (s *Store) digest(c Call) []byte {
	mac := hmac.New(sha256.New, s.key)
	mac.Write([]byte(c.Method + "\x00"))
	mac.Write(c.Body)
	return mac.Sum(nil)
}

// Run runs run once for c's key: the first call runs and its answer is
// kept (unless 5xx, or ShownOnce); a replay of the same request answers
// the kept answer without running; anything else is refused with one of
// the Err values. Errors other than those are internal.
func (s *Store) Run(ctx context.Context, c Call, run func() Answer) (Answer, error) {
	if !ValidKey(c.Key) {
		return Answer{}, ErrBadKey
	}
	kept, err := s.claim(ctx, c, s.digest(c))
	switch {
	case err != nil:
		return Answer{}, err
	case kept != nil:
		return *kept, nil
	}
	stop := s.renew(ctx, c)
	a := run()
	stop()
	s.finish(ctx, c, a)
	return a, nil
}

// claim takes c's key for this request (nil, nil), or returns the kept
// answer to replay, or the refusal.
func (s *Store) claim(ctx context.Context, c Call, sum []byte) (*Answer, error) {
	for attempt := 0; ; attempt++ {
		now := s.clk.Now()
		_, err := s.db.ExecContext(ctx, sqlInsert, c.Tenant, c.Identity, c.Key, c.Method, sum, now.UnixMilli(), now.Add(Lease).UnixMilli())
		if err == nil {
			return nil, nil
		}
		if !store.IsUniqueViolation(err) {
			return nil, fmt.Errorf("idempotency: store key: %w", err)
		}
		if attempt > 0 { // another request took the expired key first
			return nil, ErrRunning
		}
		var r row
		err = s.db.QueryRowContext(ctx, sqlRead, c.Tenant, c.Identity, c.Key).Scan(&r.digest, &r.status, &r.response, &r.created, &r.lease)
		if errors.Is(err, sql.ErrNoRows) {
			// The key went between the insert and the read (the sweep
			// deleted it, expired): it is free again, insert once more.
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("idempotency: read key: %w", err)
		}
		switch decide(r, sum, now, c.ShownOnce) {
		case expired:
			if _, err := s.db.ExecContext(ctx, sqlExpire, c.Tenant, c.Identity, c.Key, r.created); err != nil {
				return nil, fmt.Errorf("idempotency: expire key: %w", err)
			}
			continue
		case otherRequest:
			return nil, ErrOtherRequest
		case running:
			return nil, ErrRunning
		case takeOver:
			return nil, s.takeOver(ctx, c, now, r.lease)
		case shownOnce:
			return nil, ErrShownOnce
		}
		return &Answer{Status: r.status, Body: r.response}, nil
	}
}

// takeOver takes the key of a request that stopped renewing its lease
// (its process died), once: ErrRunning when another request took it
// first.
func (s *Store) takeOver(ctx context.Context, c Call, now time.Time, lease int64) error {
	res, err := s.db.ExecContext(ctx, sqlTakeOver, c.Tenant, c.Identity, c.Key, now.Add(Lease).UnixMilli(), lease)
	if err != nil {
		return fmt.Errorf("idempotency: take over key: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return ErrRunning
	}
	return nil
}

// FinishRetry bounds how finish retries a write the database refused
// with a Transient error: 9 attempts over about 25 s of waits (100 ms
// doubling). The answer waits for it: a key left running after its
// request ended would refuse the client's retries (ErrRunning) until its
// lease ran out, 2 minutes, and a key left unanswered would then let a
// retry run the call again. A PostgreSQL restart of a few seconds, the
// usual cause, is outlasted.
func FinishRetry(clk clock.Clock) store.Retry {
	return store.Retry{Clock: clk, Attempts: 9, Backoff: 100 * time.Millisecond}
}

// finish keeps a's answer under c's key, or forgets the key for a 5xx
// answer (so a retry runs). A ShownOnce answer's body is not kept. A
// transient database failure is retried (FinishRetry).
func (s *Store) finish(ctx context.Context, c Call, a Answer) {
	bg := context.WithoutCancel(ctx)
	if a.Status >= 500 {
		if err := FinishRetry(s.clk).Do(bg, func() error {
			_, err := s.db.ExecContext(bg, sqlForget, c.Tenant, c.Identity, c.Key)
			return err
		}); err != nil {
			s.log.Error("forget idempotency key", "request_id", c.RequestID, "err", err)
		}
		return
	}
	stored := a.Body
	if c.ShownOnce {
		stored = nil
	}
	if err := FinishRetry(s.clk).Do(bg, func() error {
		_, err := s.db.ExecContext(bg, sqlFinish, c.Tenant, c.Identity, c.Key, a.Status, stored)
		return err
	}); err != nil {
		s.log.Error("store idempotent answer", "request_id", c.RequestID, "err", err)
	}
}

// renew extends the lease on c's key every Renew until the returned stop
// is called.
func (s *Store) renew(ctx context.Context, c Call) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(Renew)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				lease := s.clk.Now().Add(Lease).UnixMilli()
				if _, err := s.db.ExecContext(context.WithoutCancel(ctx), sqlRenew, lease, c.Tenant, c.Identity, c.Key); err != nil {
					s.log.Warn("renew idempotency lease", "request_id", c.RequestID, "err", err)
				}
			}
		}
	}()
	return func() { close(done); <-finished }
}

// Sweep deletes the rows older than TTL whose request is no longer
// running (or whose lease is over), and returns how many.
func Sweep(ctx context.Context, db *store.DB, now time.Time) (int64, error) {
	res, err := db.ExecContext(ctx, sqlSweep, now.Add(-TTL).UnixMilli(), now.UnixMilli())
	if err != nil {
		return 0, fmt.Errorf("idempotency: sweep keys: %w", err)
	}
	return res.RowsAffected()
}
