package quota

import (
	"errors"
	"testing"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
)

func TestDecide(t *testing.T) {
	for _, tc := range []struct {
		name              string
		limit, used, want int64
		ok                bool
	}{
		{"under", 10, 3, 5, true},
		{"exactly at the limit", 10, 5, 5, true},
		{"one past", 10, 5, 6, false},
		{"already over (a lowered limit)", 10, 12, 1, false},
		{"nothing asked", 10, 12, 0, true},
		{"zero limit", 0, 0, 1, false},
		{"overflowing sum", 1 << 62, 1 << 62, 1<<63 - 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Decide(JoinTokens, tc.limit, tc.used, tc.want)
			if tc.ok != (err == nil) {
				t.Fatalf("Decide(%d, %d, %d) = %v, want ok %v", tc.limit, tc.used, tc.want, err, tc.ok)
			}
			if err == nil {
				return
			}
			var e *errs.Error
			if !errors.As(err, &e) || e.Code != errs.ResourceExhausted || e.Message != Message(JoinTokens, tc.limit, tc.used, tc.want) {
				t.Fatalf("refusal %#v", err)
			}
		})
	}
}

func TestMessage(t *testing.T) {
	for k, want := range map[Kind]string{
		JoinTokens:       "quota join_tokens exceeded: the tenant may hold at most 10 outstanding join tokens (it holds 9; this call needs 2 more)",
		Sandboxes:        "quota sandboxes exceeded: the tenant may hold at most 10 live sandboxes (it holds 9; this call needs 2 more)",
		WarmMemoryMB:     "quota warm_memory_mb exceeded: the tenant may hold at most 10 MiB of warm-pool memory (it holds 9; this call needs 2 more)",
		CommandsInFlight: "quota commands_in_flight exceeded: the tenant may hold at most 10 commands in flight (it holds 9; this call needs 2 more)",
	} {
		if got := Message(k, 10, 9, 2); got != want {
			t.Errorf("%s: %q, want %q", k, got, want)
		}
	}
	if errs.HTTPStatus(errs.ResourceExhausted) != 429 {
		t.Fatalf("RESOURCE_EXHAUSTED is HTTP %d, want 429", errs.HTTPStatus(errs.ResourceExhausted))
	}
}

func TestLimitsValidate(t *testing.T) {
	if p := Defaults().Validate(); p != nil {
		t.Fatalf("defaults invalid: %v", p)
	}
	l := Defaults()
	l.Sandboxes, l.CommandsInFlight = -1, MaxLimit+1
	p := l.Validate()
	if len(p) != 2 || p[0] != "sandboxes: 0 to 1099511627776" || p[1] != "commands_in_flight: 0 to 1099511627776" {
		t.Fatalf("problems %q", p)
	}
	for _, k := range Kinds {
		if Defaults().Of(k) <= 0 {
			t.Errorf("%s has no default", k)
		}
	}
}

func TestLockKey(t *testing.T) {
	if LockKey("t1", JoinTokens) == LockKey("t2", JoinTokens) || LockKey("t1", JoinTokens) == LockKey("t1", Sandboxes) {
		t.Fatal("lock keys collide for different tenants or quotas")
	}
	if first, again := LockKey("t1", JoinTokens), LockKey("t1", JoinTokens); first != again {
		t.Fatal("lock key is not stable")
	}
}

func TestExempt(t *testing.T) {
	if !Exempt(iam.RootTenant) || Exempt("t_acme") || Exempt("") {
		t.Fatal("only the root tenant is exempt")
	}
}
