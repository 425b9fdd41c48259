package commands

import (
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/nodes"
)

// Selector names the nodes of a fan-out: by id, or by labels (one of the
// two, never both).
type Selector struct {
	NodeIDs []string
	Labels  map[string]string
}

// ByLabels reports whether the selector picks nodes by labels, so the
// caller lists the candidate nodes for Select.
func (s Selector) ByLabels() bool { return len(s.Labels) > 0 }

// Check refuses a selector that names neither ids nor labels, or both
// (INVALID_INPUT).
func (s Selector) Check() error {
	if (len(s.NodeIDs) == 0) == (len(s.Labels) == 0) {
		return errs.New(errs.InvalidInput, "give node_ids or labels (one of them)")
	}
	return nil
}

// Select returns the ids the fan-out targets: the selector's ids, or the
// ids of the candidates (in their order) carrying every one of its labels
// with the same value, a label given as "" matching a node without it.
// No node matching the labels is INVALID_INPUT. It reads nothing.
func (s Selector) Select(candidates []nodes.Node) ([]string, error) {
	if err := s.Check(); err != nil {
		return nil, err
	}
	if !s.ByLabels() {
		return s.NodeIDs, nil
	}
	var ids []string
	for _, n := range candidates {
		if matches(n.Labels, s.Labels) {
			ids = append(ids, n.ID)
		}
	}
	if len(ids) == 0 {
		return nil, errs.New(errs.InvalidInput, "labels: no node matches")
	}
	return ids, nil
}

// matches reports whether have carries every label of want.
func matches(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}
