package idempotency_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/idempotency"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

var testKey = idempotency.DeriveKey(bytes.Repeat([]byte{7}, 32))

// runner counts how often its call ran and answers status with body.
type runner struct {
	n      int
	status int
	body   string
}

func (r *runner) run() idempotency.Answer {
	r.n++
	return idempotency.Answer{Status: r.status, Body: []byte(r.body)}
}

func call(key, body string) idempotency.Call {
	return idempotency.Call{Tenant: "root", Identity: "admin", Key: key, Method: "tenants.create", Body: []byte(body)}
}

// The first call runs and its answer is replayed for the same request; the
// key with another body, or a malformed key, is refused; keys belong to
// (tenant, identity); the stored digest is the keyed HMAC of method and
// body; a 5xx answer is not kept, so a retry runs again.
func TestRunReplaysOnce(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		s := idempotency.New(db, clock.NewFake(time.Now()), testKey, slog.Default())
		r := &runner{status: http.StatusOK, body: `{"id":"ten_1"}`}
		for i := 0; i < 2; i++ {
			a, err := s.Run(ctx, call("key-1", `{"name":"once"}`), r.run)
			if err != nil || a.Status != 200 || string(a.Body) != r.body {
				t.Fatalf("call %d: %d %s %v", i, a.Status, a.Body, err)
			}
		}
		if r.n != 1 {
			t.Fatalf("ran %d times, want 1", r.n)
		}
		var digest []byte
		if err := db.QueryRowContext(ctx, `SELECT body_sha256 FROM idempotency WHERE key = 'key-1'`).Scan(&digest); err != nil {
			t.Fatal(err)
		}
		mac := hmac.New(sha256.New, testKey)
		mac.Write([]byte("tenants.create\x00" + `{"name":"once"}`))
		plain := sha256.Sum256([]byte(`{"name":"once"}`))
		if !hmac.Equal(digest, mac.Sum(nil)) || bytes.Equal(digest, plain[:]) {
			t.Fatalf("stored digest %x is not the keyed HMAC of the request", digest)
		}
		if _, err := s.Run(ctx, call("key-1", `{"name":"twice"}`), r.run); !errors.Is(err, idempotency.ErrOtherRequest) {
			t.Fatalf("other body: %v", err)
		}
		for _, bad := range []string{"has space", string(bytes.Repeat([]byte("k"), 129)), "ü"} {
			if _, err := s.Run(ctx, call(bad, `{}`), r.run); !errors.Is(err, idempotency.ErrBadKey) {
				t.Fatalf("key %q: %v", bad, err)
			}
		}
		other := call("key-1", `{"name":"other"}`)
		other.Identity = "other-admin"
		if _, err := s.Run(ctx, other, r.run); err != nil || r.n != 2 {
			t.Fatalf("another identity's key: ran %d (%v)", r.n, err)
		}
		failing := &runner{status: http.StatusInternalServerError, body: `{}`}
		for i := 0; i < 2; i++ {
			if a, err := s.Run(ctx, call("key-5xx", `{}`), failing.run); err != nil || a.Status != 500 {
				t.Fatalf("5xx call %d: %d %v", i, a.Status, err)
			}
		}
		if failing.n != 2 {
			t.Fatalf("a 5xx answer was kept: ran %d times", failing.n)
		}
	})
}

// A call that answers a credential runs once; its answer is not stored
// (no response column), and its replay is refused with ErrShownOnce
// without running.
func TestShownOnceIsNotStored(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		s := idempotency.New(db, clock.NewFake(time.Now()), testKey, slog.Default())
		r := &runner{status: http.StatusOK, body: `{"key":"bck_secretsecretsecret"}`}
		c := call("cred", `{}`)
		c.Method, c.ShownOnce = "apiKeys.create", true
		if a, err := s.Run(ctx, c, r.run); err != nil || string(a.Body) != r.body {
			t.Fatalf("first: %s %v", a.Body, err)
		}
		if _, err := s.Run(ctx, c, r.run); !errors.Is(err, idempotency.ErrShownOnce) || r.n != 1 {
			t.Fatalf("replay: %v, ran %d", err, r.n)
		}
		var resp []byte
		var status int
		if err := db.QueryRowContext(ctx, `SELECT status, response FROM idempotency WHERE key = 'cred'`).Scan(&status, &resp); err != nil {
			t.Fatal(err)
		}
		if status != 200 || len(resp) != 0 {
			t.Fatalf("stored %d %q, want 200 and no answer", status, resp)
		}
	})
}

// Keys expire after TTL (a key that old is new again, and Sweep deletes
// it); a key held by a request whose process died is refused while its
// lease runs, then taken over once when the lease is over.
func TestExpiresAndReleases(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		ctx := context.Background()
		clk := clock.NewFake(time.Now())
		s := idempotency.New(db, clk, testKey, slog.Default())
		r := &runner{status: http.StatusOK, body: `{}`}
		if _, err := s.Run(ctx, call("k-exp", `{"name":"exp-1"}`), r.run); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Run(ctx, call("k-exp", `{"name":"exp-2"}`), r.run); !errors.Is(err, idempotency.ErrOtherRequest) {
			t.Fatalf("before expiry: %v", err)
		}
		clk.Advance(idempotency.TTL)
		if _, err := s.Run(ctx, call("k-exp", `{"name":"exp-2"}`), r.run); err != nil || r.n != 2 {
			t.Fatalf("after expiry: ran %d (%v)", r.n, err)
		}

		// A request that stored its key and died: its row is in progress.
		body := `{"name":"stuck"}`
		mac := hmac.New(sha256.New, testKey)
		mac.Write([]byte("tenants.create\x00" + body))
		now := clk.Now()
		if _, err := db.ExecContext(ctx, `INSERT INTO idempotency (tenant_id, identity_id, key, method, body_sha256, status, created_at, lease_expires_at) VALUES ('root', 'admin', 'k-stuck', 'tenants.create', $1, 0, $2, $3)`,
			mac.Sum(nil), now.UnixMilli(), now.Add(idempotency.Lease).UnixMilli()); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Run(ctx, call("k-stuck", body), r.run); !errors.Is(err, idempotency.ErrRunning) || r.n != 2 {
			t.Fatalf("in progress: %v, ran %d", err, r.n)
		}
		clk.Advance(idempotency.Lease)
		for i := 0; i < 2; i++ {
			if _, err := s.Run(ctx, call("k-stuck", body), r.run); err != nil {
				t.Fatalf("after the lease, call %d: %v", i, err)
			}
		}
		if r.n != 3 {
			t.Fatalf("taken over key ran %d times in all, want 3", r.n)
		}
		swept, err := idempotency.Sweep(ctx, db, clk.Now().Add(idempotency.TTL))
		if err != nil || swept != 2 {
			t.Fatalf("swept %d (%v), want 2", swept, err)
		}
		var n int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM idempotency`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("%d idempotency rows left (%v)", n, err)
		}
	})
}

// The digest key is HKDF-SHA256 of the KEK: 32 bytes, one per KEK, and
// not the KEK or its plain hash.
func TestDeriveKey(t *testing.T) {
	kek := bytes.Repeat([]byte{1}, 32)
	k := idempotency.DeriveKey(kek)
	plain := sha256.Sum256(kek)
	if len(k) != 32 || !bytes.Equal(k, idempotency.DeriveKey(kek)) || bytes.Equal(k, kek) || bytes.Equal(k, plain[:]) {
		t.Fatalf("derived key %x", k)
	}
	if bytes.Equal(k, idempotency.DeriveKey(bytes.Repeat([]byte{2}, 32))) {
		t.Fatal("two KEKs derive one key")
	}
}

// TestFinishOutlastsADatabaseRestart: when the database refuses the write
// that ends a request (the 5xx answer's forget, or the answer's store)
// with a restart's error (SQLSTATE 57P01), the write is retried after the
// backoff, so the key does not stay "running": the client's retry after
// a 5xx runs at once instead of being refused (CONFLICT, ErrRunning) until
// the 2-minute lease ran out, and a 2xx answer is replayed, not run again.
// The database refuses through a trigger that fails the first two writes
// of each kind; the waits run on a fake clock the test moves.
func TestFinishOutlastsADatabaseRestart(t *testing.T) {
	db := storetest.NewTestPostgres(t)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `
		CREATE SEQUENCE refused_delete;
		CREATE SEQUENCE refused_update;
		CREATE FUNCTION refuse_as_restart() RETURNS trigger AS $$
		BEGIN
			-- A sequence is not rolled back with the refused statement.
			IF (TG_OP = 'DELETE' AND nextval('refused_delete') <= 2) OR (TG_OP = 'UPDATE' AND nextval('refused_update') <= 2) THEN
				RAISE EXCEPTION 'terminating connection due to administrator command' USING ERRCODE = '57P01';
			END IF;
			IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
			RETURN NEW;
		END $$ LANGUAGE plpgsql;
		CREATE TRIGGER refuse_as_restart BEFORE DELETE OR UPDATE ON idempotency
			FOR EACH ROW EXECUTE FUNCTION refuse_as_restart();`); err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Now())
	s := idempotency.New(db, clk, testKey, slog.Default())
	// run calls s.Run in a goroutine and moves the clock past each retry
	// wait until it returns.
	run := func(c idempotency.Call, r *runner) (idempotency.Answer, error) {
		type result struct {
			a   idempotency.Answer
			err error
		}
		done := make(chan result, 1)
		go func() {
			a, err := s.Run(ctx, c, r.run)
			done <- result{a, err}
		}()
		waits := make(chan struct{})
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			for {
				if err := clk.BlockUntil(ctx, 1); err != nil {
					return
				}
				select {
				case waits <- struct{}{}:
				case <-stop:
					return
				}
			}
		}()
		for {
			select {
			case res := <-done:
				return res.a, res.err
			case <-waits:
				clk.Advance(idempotency.FinishRetry(clk).Backoff << 7) // the longest wait; 4 waits stay inside the lease
			}
		}
	}

	failing := &runner{status: http.StatusInternalServerError, body: `{"error":"db"}`}
	if a, err := run(call("key-r", `{"name":"x"}`), failing); err != nil || a.Status != 500 {
		t.Fatalf("first call: %d %v, want its 500", a.Status, err)
	}
	ok := &runner{status: http.StatusOK, body: `{"id":"ten_1"}`}
	a, err := run(call("key-r", `{"name":"x"}`), ok)
	if err != nil || a.Status != 200 || ok.n != 1 {
		t.Fatalf("retry after the 5xx: %d %v ran=%d, want it run (the key released, not %v)", a.Status, err, ok.n, idempotency.ErrRunning)
	}
	// The 2xx answer was stored through two refusals: it is replayed.
	if a, err := run(call("key-r", `{"name":"x"}`), ok); err != nil || a.Status != 200 || ok.n != 1 {
		t.Fatalf("replay: %d %v ran=%d, want the stored answer, run once", a.Status, err, ok.n)
	}
	var deletes, updates int
	if err := db.QueryRowContext(ctx, `SELECT (SELECT last_value FROM refused_delete), (SELECT last_value FROM refused_update)`).Scan(&deletes, &updates); err != nil || deletes != 3 || updates != 3 {
		t.Fatalf("writes tried: %d deletes, %d updates (%v); want 3 of each (two refused, then done)", deletes, updates, err)
	}
}
