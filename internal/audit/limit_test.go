package audit

import (
	"testing"
	"time"
)

// A flood of one refusal writes RefusalBurst rows, then one row per
// RefusalWindow/RefusalBurst; the next row written carries how many were
// suppressed before it; each (type, reason) has its own allowance.
func TestRefusalLimiter(t *testing.T) {
	l := newRefusalLimiter(RefusalBurst, RefusalWindow)
	t0 := time.Unix(1_800_000_000, 0)
	for i := range RefusalBurst {
		if ok, n := l.allow("a", t0); !ok || n != 0 {
			t.Fatalf("row %d: allowed %v, suppressed %d", i, ok, n)
		}
	}
	for range 5 {
		if ok, _ := l.allow("a", t0); ok {
			t.Fatal("a row past the burst was allowed")
		}
	}
	if ok, n := l.allow("b", t0); !ok || n != 0 {
		t.Fatalf("another key: allowed %v, suppressed %d", ok, n)
	}
	step := RefusalWindow / RefusalBurst
	if ok, _ := l.allow("a", t0.Add(step/2)); ok {
		t.Fatal("allowed before a row's share of the window passed")
	}
	ok, n := l.allow("a", t0.Add(step))
	if !ok || n != 6 {
		t.Fatalf("after %v: allowed %v, suppressed %d; want true, 6", step, ok, n)
	}
	if ok, n := l.allow("a", t0.Add(step+RefusalWindow)); !ok || n != 0 {
		t.Fatalf("a window later: allowed %v, suppressed %d", ok, n)
	}
	// A clock that steps back neither panics nor refills.
	if ok, _ := l.allow("b", t0.Add(-time.Hour)); !ok {
		t.Fatal("the second row of b was refused")
	}
}

// FuzzRefusalLimiter: whatever the order of calls, a key never gets more
// rows than its burst plus its refill, and every suppressed call is
// counted on the next allowed row of its key.
func FuzzRefusalLimiter(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 2, 3, 0, 0})
	f.Add([]byte{255, 255, 0, 17, 4})
	f.Fuzz(func(t *testing.T, steps []byte) {
		l := newRefusalLimiter(3, time.Minute)
		now := time.Unix(1_800_000_000, 0)
		start := now
		allowed, pending := map[string]int{}, map[string]int{}
		for _, b := range steps {
			key := string('a' + rune(b%2))
			now = now.Add(time.Duration(b>>1) * time.Second)
			ok, n := l.allow(key, now)
			if !ok {
				pending[key]++
				continue
			}
			if n != pending[key] {
				t.Fatalf("%s: suppressed %d, want %d", key, n, pending[key])
			}
			pending[key] = 0
			allowed[key]++
			if limit := 3 + int(now.Sub(start)/(20*time.Second)); allowed[key] > limit {
				t.Fatalf("%s: %d rows allowed by %v, limit %d", key, allowed[key], now.Sub(start), limit)
			}
		}
	})
}
