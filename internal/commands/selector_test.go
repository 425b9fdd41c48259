package commands

import (
	"slices"
	"testing"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/nodes"
)

// A fan-out names ids or labels, not both and not neither; labels pick
// every node carrying all of them, in the candidates' order, and picking
// none is refused.
func TestSelector(t *testing.T) {
	fleet := []nodes.Node{
		{ID: "n1", Labels: map[string]string{"zone": "a", "gpu": "yes"}},
		{ID: "n2", Labels: map[string]string{"zone": "b"}},
		{ID: "n3", Labels: map[string]string{"zone": "a"}},
		{ID: "n4"},
	}
	cases := []struct {
		name string
		sel  Selector
		want []string
		code errs.Code
	}{
		{"ids as given", Selector{NodeIDs: []string{"n9", "n2"}}, []string{"n9", "n2"}, ""},
		{"one label", Selector{Labels: map[string]string{"zone": "a"}}, []string{"n1", "n3"}, ""},
		{"every label must match", Selector{Labels: map[string]string{"zone": "a", "gpu": "yes"}}, []string{"n1"}, ""},
		{"value must be equal", Selector{Labels: map[string]string{"zone": "A"}}, nil, errs.InvalidInput},
		{"empty value matches a missing label", Selector{Labels: map[string]string{"gpu": ""}}, []string{"n2", "n3", "n4"}, ""},
		{"no match", Selector{Labels: map[string]string{"zone": "c"}}, nil, errs.InvalidInput},
		{"neither", Selector{}, nil, errs.InvalidInput},
		{"both", Selector{NodeIDs: []string{"n1"}, Labels: map[string]string{"zone": "a"}}, nil, errs.InvalidInput},
	}
	for _, c := range cases {
		got, err := c.sel.Select(fleet)
		wrong := err != nil
		if c.code != "" {
			wrong = errs.CodeOf(err) != c.code
		}
		if wrong || !slices.Equal(got, c.want) {
			t.Errorf("%s: %v %v, want %v %s", c.name, got, err, c.want, c.code)
		}
	}
	if (Selector{Labels: map[string]string{"a": "b"}}).Check() != nil || (Selector{}).Check() == nil {
		t.Fatal("Check disagrees with Select")
	}
}
