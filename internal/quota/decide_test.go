package quota

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
)

func TestTopLevelOf(t *testing.T) {
	root := iam.Tenant{ID: iam.RootTenant}
	a := iam.Tenant{ID: "t_a", ParentID: iam.RootTenant}
	kid := iam.Tenant{ID: "t_kid", ParentID: "t_a"}
	grand := iam.Tenant{ID: "t_grand", ParentID: "t_kid"}
	deep := make([]iam.Tenant, 0, MaxDepth+1)
	for i := range MaxDepth + 1 {
		deep = append(deep, iam.Tenant{ID: fmt.Sprintf("t_%d", i), ParentID: fmt.Sprintf("t_%d", i+1)})
	}
	for _, tc := range []struct {
		name, tenant string
		chain        []iam.Tenant
		want         string
		tooDeep      bool
	}{
		{"the root tenant is its own", iam.RootTenant, []iam.Tenant{root}, iam.RootTenant, false},
		{"a top-level tenant is its own", "t_a", []iam.Tenant{a, root}, "t_a", false},
		{"a child is charged to its top-level tenant", "t_kid", []iam.Tenant{kid, a, root}, "t_a", false},
		{"a grandchild too", "t_grand", []iam.Tenant{grand, kid, a, root}, "t_a", false},
		{"an unknown tenant is its own", "t_ghost", nil, "t_ghost", false},
		{"a chain that never reaches the root is too deep", "t_0", deep, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := topLevelOf(tc.tenant, tc.chain)
			if tc.tooDeep {
				var e *errs.Error
				if !errors.As(err, &e) || e.Code != errs.InvalidState || err != errTooDeep {
					t.Fatalf("topLevelOf = %q, %v; want errTooDeep", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("topLevelOf = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// FuzzDecide checks the admission rule's invariants: asking for nothing is
// always admitted; an admission never takes the tenant past its limit (nor
// overflows); a refusal is RESOURCE_EXHAUSTED with the exact message.
func FuzzDecide(f *testing.F) {
	f.Add(int64(10), int64(3), int64(5))
	f.Add(int64(10), int64(5), int64(6))
	f.Add(int64(0), int64(0), int64(1))
	f.Add(int64(1<<62), int64(1<<62), int64(1<<63-1))
	f.Add(int64(10), int64(12), int64(0))
	f.Fuzz(func(t *testing.T, limit, used, want int64) {
		err := Decide(Sandboxes, limit, used, want)
		if want <= 0 {
			if err != nil {
				t.Fatalf("want %d refused: %v", want, err)
			}
			return
		}
		sum := used + want
		fits := sum >= used && sum <= limit
		if fits != (err == nil) {
			t.Fatalf("Decide(%d, %d, %d) = %v, fits %v", limit, used, want, err, fits)
		}
		if err != nil {
			var e *errs.Error
			if !errors.As(err, &e) || e.Code != errs.ResourceExhausted || e.Message != Message(Sandboxes, limit, used, want) {
				t.Fatalf("refusal %#v", err)
			}
		}
	})
}

// FuzzTopLevelOf checks, on chains of arbitrary parent links, that the
// top-level tenant is a root's child of the chain, the root's own or the
// unknown tenant itself, and otherwise the answer is errTooDeep.
func FuzzTopLevelOf(f *testing.F) {
	f.Add("t_kid", "t_a", iam.RootTenant, "")
	f.Add("t_a", iam.RootTenant, "", "")
	f.Add(iam.RootTenant, "", "", "")
	f.Add("t_x", "t_y", "t_z", "t_w")
	f.Fuzz(func(t *testing.T, tenant, p0, p1, p2 string) {
		chain := []iam.Tenant{{ID: tenant, ParentID: p0}, {ID: p0, ParentID: p1}, {ID: p1, ParentID: p2}}
		got, err := topLevelOf(tenant, chain)
		switch {
		case iam.IsRoot(tenant):
			if got != tenant || err != nil {
				t.Fatalf("root: %q, %v", got, err)
			}
		case err != nil:
			if err != errTooDeep {
				t.Fatalf("unexpected error %v", err)
			}
			for _, c := range chain {
				if iam.IsRoot(c.ParentID) {
					t.Fatalf("errTooDeep though %s is a root's child", c.ID)
				}
			}
		default:
			found := false
			for _, c := range chain {
				if c.ID == got && iam.IsRoot(c.ParentID) {
					found = true
					break
				}
				if iam.IsRoot(c.ParentID) {
					t.Fatalf("%q is not the nearest root's child (%q is)", got, c.ID)
				}
			}
			if !found {
				t.Fatalf("%q is not a root's child of the chain", got)
			}
		}
	})
}

func TestUsageFresh(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	for _, tc := range []struct {
		age  time.Duration
		want bool
	}{
		{0, true},
		{RecountEvery - time.Millisecond, true},
		{RecountEvery, false},
		{time.Hour, false},
		{-time.Minute, true},
	} {
		if got := usageFresh(now.Add(-tc.age).UnixMilli(), now); got != tc.want {
			t.Errorf("age %v: fresh %v, want %v", tc.age, got, tc.want)
		}
	}
}
