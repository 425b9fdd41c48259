package plugin

import (
	"fmt"
	"hash/fnv"
	"maps"
	"testing"
)

func slot(name string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(name))
	return IDBase + h.Sum32()%IDSize
}

func none(uint32) bool { return false }

// TestAssignIDsStableAndSkips: ids depend on the set of names, not their
// order; each is in the block; an id an account holds is skipped, and of
// two names whose slots collide the first in name order keeps the slot.
func TestAssignIDsStableAndSkips(t *testing.T) {
	a, err := AssignIDs([]string{"sim", "kata", "gpu-x"}, none)
	if err != nil {
		t.Fatal(err)
	}
	b, err := AssignIDs([]string{"gpu-x", "sim", "kata", "sim"}, none)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(a, b) || len(a) != 3 {
		t.Fatalf("reordering changed the ids: %v vs %v", a, b)
	}
	for n, id := range a {
		if id != slot(n) || id < IDBase || id >= IDBase+IDSize {
			t.Fatalf("%s got %#x, want its slot %#x", n, id, slot(n))
		}
	}
	taken := func(id uint32) bool { return id == slot("sim") }
	c, _ := AssignIDs([]string{"sim"}, taken)
	if want := IDBase + (slot("sim")-IDBase+1)%IDSize; c["sim"] != want {
		t.Fatalf("taken uid not skipped: %#x, want %#x", c["sim"], want)
	}
	x, y := collidingNames(t)
	for _, order := range [][]string{{x, y}, {y, x}} {
		got, _ := AssignIDs(order, none)
		if got[x] != slot(x) || got[y] != IDBase+(slot(x)-IDBase+1)%IDSize {
			t.Fatalf("collision %s/%s in order %v: %v", x, y, order, got)
		}
	}
}

// collidingNames finds two names (x < y) with the same slot.
func collidingNames(t *testing.T) (string, string) {
	seen := map[uint32]string{}
	for i := 0; i < 1<<20; i++ {
		n := fmt.Sprintf("p%d", i)
		if o, ok := seen[slot(n)]; ok {
			if o > n {
				return n, o
			}
			return o, n
		}
		seen[slot(n)] = n
	}
	t.Fatal("no collision found")
	return "", ""
}

// TestAssignIDsRefusals: an invalid name, and a full block.
func TestAssignIDsRefusals(t *testing.T) {
	if _, err := AssignIDs([]string{"Bad/Name"}, none); CodeOf(err) != CodeNameInvalid {
		t.Fatalf("bad name: %v", err)
	}
	if _, err := AssignIDs([]string{"sim"}, func(uint32) bool { return true }); CodeOf(err) != CodeIDsExhausted {
		t.Fatalf("full block: %v", err)
	}
}
