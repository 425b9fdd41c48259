package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/quorum/quorumwire"
)

// approversFile keeps the approver-set changes this node accepted (0600).
// It holds only signed changes: on start they are checked again, in order,
// from the set in the pinned trust bundle, so editing the file can only
// drop changes, never add one the quorum did not sign.
const approversFile = "approvers.json"

type approversRecord struct {
	// Chain holds each accepted SignedApproverSet, marshalled, oldest first.
	Chain [][]byte `json:"chain"`
}

// approvers is the node's approver set in force and how it got there.
type approvers struct {
	mu         sync.Mutex
	deployment string
	set        quorumwire.ApproverSet
	chain      [][]byte // accepted changes, marshalled deterministically
	onChange   func(generation uint64, reason string)
}

// newApprovers starts from the trust bundle's set (none: the zero set, so
// no destructive command and no set change is ever accepted) and replays
// the changes kept in dir.
func newApprovers(tb pki.TrustBundle, dir string) (*approvers, error) {
	a := &approvers{deployment: tb.Deployment}
	if len(tb.Approvers) > 0 {
		set, err := quorumwire.NewApproverSet(0, tb.Threshold, tb.Approvers)
		if err != nil {
			return nil, fmt.Errorf("daemon: pinned approvers: %w", err)
		}
		a.set = set
	}
	var rec approversRecord
	if err := readJSON(dir, approversFile, &rec); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("daemon: %s: %w", approversFile, err)
	}
	for _, raw := range rec.Chain {
		var m nodev1.SignedApproverSet
		if err := proto.Unmarshal(raw, &m); err != nil {
			return nil, fmt.Errorf("daemon: %s: %w", approversFile, err)
		}
		if _, reason := a.apply(&m); reason != "" {
			return nil, fmt.Errorf("daemon: %s: a kept approver-set change no longer verifies (%s)", approversFile, reason)
		}
	}
	return a, nil
}

// current returns the set in force.
func (a *approvers) current() quorumwire.ApproverSet {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.set
}

// apply checks one change against the set in force and adopts it. A
// change already in the chain is skipped (changed false, no reason).
func (a *approvers) apply(m *nodev1.SignedApproverSet) (changed bool, reason string) {
	raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return false, ReasonSetMalformed
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if g := m.GetGeneration(); g >= 1 && g <= uint64(len(a.chain)) && bytes.Equal(a.chain[g-1], raw) {
		return false, ""
	}
	sigs := make([]quorumwire.Signature, 0, len(m.Signatures))
	for _, s := range m.Signatures {
		sigs = append(sigs, quorumwire.Signature{PublicKey: s.GetPublicKey(), Signature: s.GetSignature()})
	}
	next, err := quorumwire.NextApproverSet(a.set, a.deployment, m.GetDeployment(), m.GetGeneration(), int(m.GetThreshold()), m.GetKeys(), sigs)
	switch {
	case errors.Is(err, quorumwire.ErrWrongDeployment):
		return false, ReasonSetWrongDeployment
	case errors.Is(err, quorumwire.ErrReplayed):
		return false, ReasonSetReplayed
	case errors.Is(err, quorumwire.ErrUnpinned):
		return false, ReasonSetUnpinned
	case errors.Is(err, quorumwire.ErrUnderQuorum):
		return false, ReasonSetUnderQuorum
	case err != nil:
		return false, ReasonSetMalformed
	}
	if next.Generation != uint64(len(a.chain))+1 {
		// The chain file is indexed by generation: a change that skips one
		// is refused rather than leaving a hole.
		return false, ReasonSetMalformed
	}
	a.set = next
	a.chain = append(a.chain, raw)
	return true, ""
}

// applyApproverSets applies changes in order, stopping at the first
// refusal (later changes are signed by the set it would have made),
// persists the chain when it grew, and then tells OnApproverSet of each
// decision.
func (n *Node) applyApproverSets(sets []*nodev1.SignedApproverSet) {
	a := n.approvers
	type decision struct {
		generation uint64
		reason     string
	}
	var decided []decision
	grew := false
	for _, m := range sets {
		changed, reason := a.apply(m)
		if reason != "" {
			n.cfg.Log.Warn("approver set refused", "node_id", n.rec.NodeID, "generation", m.GetGeneration(), "reason", reason)
			decided = append(decided, decision{m.GetGeneration(), reason})
			break
		}
		if changed {
			grew = true
			n.cfg.Log.Warn("approver set changed", "node_id", n.rec.NodeID, "generation", m.GetGeneration(), "threshold", m.GetThreshold())
			decided = append(decided, decision{m.GetGeneration(), ""})
		}
	}
	if grew {
		a.mu.Lock()
		rec := approversRecord{Chain: append([][]byte(nil), a.chain...)}
		a.mu.Unlock()
		if err := writeJSON(n.cfg.DataDir, approversFile, rec); err != nil {
			n.cfg.Log.Error("persist approver sets", "err", err)
		}
	}
	for _, d := range decided {
		a.notify(d.generation, d.reason)
	}
}

func (a *approvers) notify(generation uint64, reason string) {
	a.mu.Lock()
	f := a.onChange
	a.mu.Unlock()
	if f != nil {
		f(generation, reason)
	}
}

// OnApproverSet registers f to be told of every approver-set change the
// node accepts (reason "") or refuses (its reason). Tests and operators'
// tooling wait on it.
func (n *Node) OnApproverSet(f func(generation uint64, reason string)) {
	n.approvers.mu.Lock()
	n.approvers.onChange = f
	n.approvers.mu.Unlock()
}

// ApproverGeneration returns the generation of the approver set in force
// (0: the trust bundle's).
func (n *Node) ApproverGeneration() uint64 { return n.approvers.current().Generation }
