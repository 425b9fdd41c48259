package api

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/apikeys"
	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

const testTimeout = 10 * time.Second

// The limiter admits up to its bound of one tenant's mutations at once,
// refuses the next (RATE_LIMITED), frees a slot on release, lets reads
// and other tenants through meanwhile, and forgets an idle tenant.
func TestTenantLimiter(t *testing.T) {
	l := newTenantLimiter(2, 0)
	ctx := context.Background()
	r1, err1 := l.admit(ctx, "a", true)
	r2, err2 := l.admit(ctx, "a", true)
	if err1 != nil || err2 != nil {
		t.Fatalf("two slots: %v %v", err1, err2)
	}
	if _, err := l.admit(ctx, "a", true); errs.CodeOf(err) != errs.RateLimited || !errors.Is(err, errTenantBusy) {
		t.Fatalf("third mutation: %v, want RATE_LIMITED", err)
	}
	if r, err := l.admit(ctx, "a", false); err != nil {
		t.Fatalf("a read was limited: %v", err)
	} else {
		r()
	}
	rb, err := l.admit(ctx, "b", true)
	if err != nil {
		t.Fatalf("another tenant was limited: %v", err)
	}
	rb()
	r1()
	r3, err := l.admit(ctx, "a", true)
	if err != nil {
		t.Fatalf("after a release: %v", err)
	}
	r2()
	r3()
	if len(l.slots) != 0 || len(l.users) != 0 {
		t.Fatalf("idle tenants kept: %v %v", l.slots, l.users)
	}
}

// Through the envelope: while a tenant's mutating calls hold all its
// slots, its next mutating call answers 429 RATE_LIMITED (with
// Retry-After) before its handler runs, its reads still answer, and once
// a call finishes the next one runs.
func TestTenantMutationsBounded(t *testing.T) {
	db := storetest.NewTestSQLite(t)
	clk := clock.Real{}
	keys := apikeys.New(db, clk, iam.New(db, clk))
	srv, err := NewServer(Config{RateLimits: RateLimits{ReadPerSecond: 1e6, ReadBurst: 1e6, MutatePerSecond: 1e6, MutateBurst: 1e6}, TenantMutates: 1},
		Deps{DB: db, Keys: keys, IAM: iam.New(db, clk), Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	srv.tenants.wait = 0 // refuse at once rather than after a brief queue
	entered, release := make(chan struct{}, 4), make(chan struct{})
	var ran atomic.Int32
	srv.Register(
		Def("test.block", "compute:test:block", true, nil, func(ctx context.Context, c *Caller, _ struct{}) (any, error) {
			ran.Add(1)
			entered <- struct{}{}
			<-release
			return map[string]any{}, nil
		}),
		Def("test.read", "compute:test:get", false, nil, func(ctx context.Context, c *Caller, _ struct{}) (any, error) {
			return map[string]any{}, nil
		}),
	)
	_, key, err := keys.Create(context.Background(), audit.Entry{TenantID: "root", Actor: "test"}, "root", "admin", "admin", 0)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free) // runs before hs.Close, so a failed run never hangs
	try := func(method string) (*http.Response, string, error) {
		req, _ := http.NewRequest(http.MethodPost, hs.URL+"/api/v1/"+method, strings.NewReader("{}"))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Better-Compute", "1")
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := (&http.Client{Timeout: testTimeout}).Do(req)
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b), nil
	}
	call := func(method string) (*http.Response, string) {
		resp, body, err := try(method)
		if err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		return resp, body
	}
	first := make(chan int, 1)
	go func() {
		resp, _, err := try("test.block")
		if err != nil {
			first <- 0
			return
		}
		first <- resp.StatusCode
	}()
	<-entered
	resp, body := call("test.block")
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, `"code":"RATE_LIMITED"`) ||
		!strings.Contains(body, "too many mutating calls of this tenant at once") || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("second mutation: %d %s (Retry-After %q)", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}
	if resp, body := call("test.read"); resp.StatusCode != http.StatusOK {
		t.Fatalf("a read while the tenant's mutations are busy: %d %s", resp.StatusCode, body)
	}
	free()
	if st := <-first; st != http.StatusOK {
		t.Fatalf("first mutation: %d", st)
	}
	if resp, body := call("test.block"); resp.StatusCode != http.StatusOK || ran.Load() != 2 {
		t.Fatalf("after the slot freed: %d %s, handler ran %d times", resp.StatusCode, body, ran.Load())
	}
}

// A call's mutation slots are its top-level tenant's: a child's and a
// grandchild's calls share their top-level tenant's slots (so child
// tenants are no way to more), other top-level tenants and root keep
// their own.
func TestTenantSlotsTopLevel(t *testing.T) {
	root := iam.Tenant{ID: iam.RootTenant}
	a := iam.Tenant{ID: "t_a", ParentID: iam.RootTenant}
	kid := iam.Tenant{ID: "t_kid", ParentID: "t_a"}
	grand := iam.Tenant{ID: "t_grand", ParentID: "t_kid"}
	for _, tc := range []struct {
		tenant string
		chain  []iam.Tenant
		want   string
	}{
		{"t_a", []iam.Tenant{a, root}, "t_a"},
		{"t_kid", []iam.Tenant{kid, a, root}, "t_a"},
		{"t_grand", []iam.Tenant{grand, kid, a, root}, "t_a"},
		{iam.RootTenant, nil, iam.RootTenant},
	} {
		if got := slotTenant(tc.tenant, tc.chain); got != tc.want {
			t.Errorf("slots of %s: %s, want %s", tc.tenant, got, tc.want)
		}
	}
	l := newTenantLimiter(1, 0)
	ctx := context.Background()
	r, err := l.admit(ctx, slotTenant("t_a", []iam.Tenant{a, root}), true)
	if err != nil {
		t.Fatal(err)
	}
	defer r()
	if _, err := l.admit(ctx, slotTenant("t_kid", []iam.Tenant{kid, a, root}), true); !errors.Is(err, errTenantBusy) {
		t.Fatalf("a child's mutation while its parent holds the one slot: %v, want RATE_LIMITED", err)
	}
}
