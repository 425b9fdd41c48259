package afterreply

import (
	"context"
	"slices"
	"testing"
)

// TestDeferredUntilRun: work deferred in a call's context runs only at
// Run, in order, once; outside a call, and after Run, it runs at once.
func TestDeferredUntilRun(t *testing.T) {
	var got []string
	add := func(s string) func() { return func() { got = append(got, s) } }

	Do(context.Background(), add("no call"))
	if !slices.Equal(got, []string{"no call"}) {
		t.Fatalf("outside a call: %v, want it run at once", got)
	}
	got = nil
	ctx, l := With(context.Background())
	Do(ctx, add("a"))
	Do(ctx, add("b"))
	if len(got) != 0 {
		t.Fatalf("before Run: %v ran", got)
	}
	l.Run()
	l.Run()
	if !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("after Run: %v, want [a b] once", got)
	}
	Do(ctx, add("late"))
	if !slices.Equal(got, []string{"a", "b", "late"}) {
		t.Fatalf("after Run, Do: %v, want it run at once", got)
	}
}
