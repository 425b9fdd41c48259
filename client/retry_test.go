package client_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/api"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/server"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// fakeSleeper records the waits asked of it and returns at once (and,
// when clk is set, moves that clock on by each wait).
type fakeSleeper struct {
	mu    sync.Mutex
	waits []time.Duration
	clk   *clock.Fake
}

func (f *fakeSleeper) sleep(_ context.Context, d time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.waits = append(f.waits, d)
	if f.clk != nil {
		f.clk.Advance(d)
	}
	return nil
}

// scripted answers each request with the next of answers (status,
// Retry-After, code), then 200 {}; it counts requests and keeps the
// Idempotency-Key of each.
type scripted struct {
	mu      sync.Mutex
	answers [][3]string
	keys    []string
}

func (s *scripted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys = append(s.keys, r.Header.Get("Idempotency-Key"))
	if len(s.keys) > len(s.answers) {
		_, _ = w.Write([]byte(`{}`))
		return
	}
	a := s.answers[len(s.keys)-1]
	if a[1] != "" {
		w.Header().Set("Retry-After", a[1])
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(map[string]int{"429": 429, "503": 503, "500": 500, "403": 403}[a[0]])
	_, _ = w.Write([]byte(`{"error":{"code":"` + a[2] + `","message":"m","request_id":"r"}}`))
}

func (s *scripted) requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys)
}

func newScripted(t *testing.T, answers ...[3]string) (*scripted, *client.Client, *fakeSleeper) {
	t.Helper()
	s := &scripted{answers: answers}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	c := client.New(srv.URL, "bck_x")
	f := &fakeSleeper{}
	c.Retry.Sleep = f.sleep
	return s, c, f
}

// A RATE_LIMITED answer is sent again after its Retry-After (at least 1 s
// when it names none), with the same Idempotency-Key.
func TestClientRetriesRateLimitedAfterRetryAfter(t *testing.T) {
	s, c, f := newScripted(t, [3]string{"429", "3", "RATE_LIMITED"}, [3]string{"429", "", "RATE_LIMITED"})
	if err := c.CallIdempotent(context.Background(), "tenants.create", "k-1", map[string]any{"name": "a"}, nil); err != nil {
		t.Fatalf("call: %v", err)
	}
	if s.requests() != 3 {
		t.Fatalf("%d requests, want 3", s.requests())
	}
	if len(f.waits) != 2 || f.waits[0] != 3*time.Second || f.waits[1] != time.Second {
		t.Fatalf("waits %v, want [3s 1s]", f.waits)
	}
	for _, k := range s.keys {
		if k != "k-1" {
			t.Fatalf("retry sent Idempotency-Key %q, want k-1 every time", k)
		}
	}
}

// Retries are bounded by tries and by the total wait; any other code is
// never retried.
func TestClientRetryIsBoundedAndOnlyForRateLimited(t *testing.T) {
	ctx := context.Background()
	limited := [3]string{"429", "1", "RATE_LIMITED"}
	s, c, f := newScripted(t, limited, limited, limited, limited, limited, limited, limited)
	c.Retry.MaxTries = 4
	if err := c.Call(ctx, "nodes.list", nil, nil); !errors.Is(err, client.ErrRateLimited) {
		t.Fatalf("after the tries: %v, want RATE_LIMITED", err)
	}
	if s.requests() != 4 || len(f.waits) != 3 {
		t.Fatalf("%d requests and %d waits, want 4 and 3", s.requests(), len(f.waits))
	}

	// A Retry-After past the total cap is not waited out.
	s, c, f = newScripted(t, [3]string{"429", "10", "RATE_LIMITED"}, [3]string{"429", "25", "RATE_LIMITED"})
	c.Retry.MaxWait = 30 * time.Second
	if err := c.Call(ctx, "nodes.list", nil, nil); !errors.Is(err, client.ErrRateLimited) {
		t.Fatalf("past the cap: %v, want RATE_LIMITED", err)
	}
	if s.requests() != 2 || len(f.waits) != 1 {
		t.Fatalf("%d requests and %d waits, want 2 and 1 (10 s + 25 s passes 30 s)", s.requests(), len(f.waits))
	}

	for _, a := range [][3]string{{"503", "1", "INTERNAL_ERROR"}, {"500", "", "INTERNAL_ERROR"}, {"403", "", "ACCESS_DENIED"}, {"429", "1", "RESOURCE_EXHAUSTED"}} {
		s, c, f := newScripted(t, a)
		if err := c.Call(ctx, "tenants.create", map[string]any{"name": "a"}, nil); client.CodeOf(err) != a[2] {
			t.Fatalf("%v: %v", a, err)
		}
		if s.requests() != 1 || len(f.waits) != 0 {
			t.Fatalf("%v was retried: %d requests", a, s.requests())
		}
	}
}

// Against the real API: a mutation refused RATE_LIMITED did not run (the
// envelope refuses before the method), so the client sends it again
// without a key, it runs once, and the wait is the server's Retry-After
// on the server's own (fake) clock, never the wall clock.
func TestClientRetriesRealRateLimitedMutationOnce(t *testing.T) {
	clk := clock.NewFake(time.Now())
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Clock: clk, Tune: func(o *server.Options) {
		o.RateLimits = api.RateLimits{ReadPerSecond: 100, ReadBurst: 100, MutatePerSecond: 1, MutateBurst: 1}
	}})
	ctx := context.Background()
	f := &fakeSleeper{clk: clk}
	c := client.New(e.Client.BaseURL, e.AdminKey)
	c.Retry.Sleep = f.sleep
	for _, name := range []string{"r1", "r2"} {
		if _, err := c.CreateTenant(ctx, "", name); err != nil {
			t.Fatalf("create %s: %v", name, err)
		}
	}
	if len(f.waits) != 1 || f.waits[0] != time.Second {
		t.Fatalf("waits %v, want one of 1s (the server's Retry-After)", f.waits)
	}
	var out struct {
		Tenants []client.Tenant `json:"tenants"`
	}
	if err := c.Call(ctx, "tenants.list", nil, &out); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, tn := range out.Tenants {
		if tn.Name == "r2" {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("tenant r2 exists %d times, want 1", n)
	}
}
