package quorum

import (
	"bytes"
	"crypto/ed25519"
	"fmt"
	"time"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/quorum/quorumwire"
)

// The control plane's quorum checks. Each is a pure function: it reads no
// rows and calls no clock, so it is tested (and fuzzed) without a control
// plane. Nothing here is trusted by a node, which checks every signature,
// threshold, expiry and proof again (package quorumwire); these checks keep
// honest mistakes out of the queue.

// checkShape checks a proposal's size and lifetime and returns the
// lifetime to use (DefaultLifetime for none).
func checkShape(leaves int, ttl time.Duration) (time.Duration, error) {
	if leaves == 0 || leaves > quorumwire.MaxLeaves {
		return 0, errs.New(errs.InvalidInput, fmt.Sprintf("leaves: a batch holds 1..%d leaves", quorumwire.MaxLeaves))
	}
	if ttl == 0 {
		ttl = DefaultLifetime
	}
	if ttl < 0 || ttl > quorumwire.MaxBatchLifetime {
		return 0, errs.New(errs.InvalidInput, "expires: between 1 second and 7 days")
	}
	return ttl, nil
}

// batchPlan is a proposal checked and hashed, ready to store.
type batchPlan struct {
	tenant   string // the first leaf's node's tenant
	leaves   []quorumwire.Leaf
	payloads [][]byte // canonical; nil for an unbound leaf
	root     []byte
}

// planLeaves checks a proposal's leaves in order and builds its Merkle
// tree. tenants[i] is leaf i's node's tenant; when reading one failed,
// tenants stops there and tenantErr is that failure, returned when the
// check reaches that leaf. A node outside scope is NOT_FOUND, as a node
// that does not exist is.
func planLeaves(scope iam.Scope, in []LeafInput, tenants []string, tenantErr error) (batchPlan, error) {
	p := batchPlan{leaves: make([]quorumwire.Leaf, len(in)), payloads: make([][]byte, len(in))}
	seen := map[string]bool{}
	for i, li := range in {
		if !kinds.Known(li.Kind) {
			return batchPlan{}, errs.New(errs.InvalidInput, fmt.Sprintf("leaves[%d].kind: unknown command kind", i))
		}
		if i >= len(tenants) {
			if tenantErr == nil {
				tenantErr = errs.New(errs.NotFound, "node not found")
			}
			return batchPlan{}, tenantErr
		}
		if !scope.Sees(tenants[i]) {
			return batchPlan{}, errs.New(errs.NotFound, "node not found")
		}
		if p.tenant == "" {
			p.tenant = tenants[i]
		}
		l, payload, err := planLeaf(i, li)
		if err != nil {
			return batchPlan{}, err
		}
		enc := string(l.Encode())
		if seen[enc] {
			return batchPlan{}, errs.New(errs.InvalidInput, fmt.Sprintf("leaves[%d]: the same leaf twice", i))
		}
		seen[enc] = true
		p.leaves[i], p.payloads[i] = l, payload
	}
	root, err := quorumwire.Root(p.leaves)
	if err != nil {
		return batchPlan{}, errs.Wrap(errs.InvalidInput, "leaves: no Merkle root", err)
	}
	p.root = root
	return p, nil
}

// planLeaf builds leaf i: unbound (no payload), or bound to the canonical
// form of its payload.
func planLeaf(i int, li LeafInput) (quorumwire.Leaf, []byte, error) {
	var l quorumwire.Leaf
	var payload []byte
	if li.Unbound {
		if len(li.Payload) > 0 {
			return l, nil, errs.New(errs.InvalidInput, fmt.Sprintf("leaves[%d]: an unbound leaf takes no payload", i))
		}
		l = quorumwire.UnboundLeaf(li.NodeID, li.Kind)
	} else {
		p, err := quorumwire.CanonicalPayload(li.Payload)
		if err != nil {
			return l, nil, errs.Wrap(errs.InvalidInput, fmt.Sprintf("leaves[%d].payload: not valid JSON of at most 64 KiB", i), err)
		}
		payload = p
		l = quorumwire.BoundLeaf(li.NodeID, li.Kind, p)
	}
	if err := l.Validate(); err != nil {
		return l, nil, errs.Wrap(errs.InvalidInput, fmt.Sprintf("leaves[%d]: not a valid leaf", i), err)
	}
	return l, payload, nil
}

// errRootMismatch is the answer for a batch whose stored leaves no longer
// hash to its stored root.
var errRootMismatch = errs.New(errs.InvalidState, "the batch's leaves do not match its root")

// rootMatches reports whether leaves hash to root.
func rootMatches(leaves []quorumwire.Leaf, root []byte) bool {
	got, err := quorumwire.Root(leaves)
	return err == nil && bytes.Equal(got, root)
}

// checkApproval decides one approval of batch r by key (a member of set)
// at nowMS: the batch must be unexpired and intact, the signature valid
// over it and the approver new to it. reached reports whether, with it,
// a proposed batch has set's threshold of valid approvals.
func checkApproval(set quorumwire.ApproverSet, r *batchRow, key, sig []byte, nowMS int64) (reached bool, err error) {
	if nowMS >= r.expiresMS {
		return false, errs.New(errs.InvalidState, "the batch has expired")
	}
	if !rootMatches(r.leaves, r.root) {
		return false, errRootMismatch
	}
	msg := quorumwire.ApprovalMessage(r.Deployment, r.ID, r.root, r.expiresMS)
	if len(key) != ed25519.PublicKeySize || !ed25519.Verify(ed25519.PublicKey(key), msg, sig) {
		return false, errs.New(errs.InvalidInput, "the signature does not verify over this batch")
	}
	for _, a := range r.approvals {
		if bytes.Equal(a.PublicKey, key) {
			return false, errs.New(errs.Conflict, "this approver already approved the batch")
		}
	}
	sigs := append(r.approvals[:len(r.approvals):len(r.approvals)], quorumwire.Signature{PublicKey: key, Signature: sig})
	return r.State == StateProposed && countValid(set, msg, sigs) >= set.Threshold, nil
}

// countValid counts distinct keys of set with a valid signature over msg.
func countValid(set quorumwire.ApproverSet, msg []byte, sigs []quorumwire.Signature) int {
	seen := map[string]bool{}
	for _, s := range sigs {
		if set.Contains(s.PublicKey) && !seen[string(s.PublicKey)] && len(s.PublicKey) == ed25519.PublicKeySize &&
			ed25519.Verify(ed25519.PublicKey(s.PublicKey), msg, s.Signature) {
			seen[string(s.PublicKey)] = true
		}
	}
	return len(seen)
}

// admits checks that batch r is unexpired at nowMS and has a leaf for
// (nodeID, kind, payload).
func admits(r *batchRow, nowMS int64, nodeID, kind string, payload []byte) error {
	if nowMS >= r.expiresMS {
		return errs.New(errs.InvalidState, "the batch has expired")
	}
	for _, l := range r.leaves {
		if l.Admits(nodeID, kind, payload) {
			return nil
		}
	}
	return errs.New(errs.InvalidInput, "the batch has no leaf for this node, kind and payload")
}

// pickLeaf returns the index of the first leaf admitting (nodeID, kind,
// payload), preferring a bound leaf to an unbound one, or -1.
func pickLeaf(leaves []quorumwire.Leaf, nodeID, kind string, payload []byte) int {
	idx := -1
	for i, l := range leaves {
		if l.Admits(nodeID, kind, payload) && (idx < 0 || leaves[idx].Unbound && !l.Unbound) {
			idx = i
		}
	}
	return idx
}

// checkSetSignature decides one signature by approverKey over a proposed
// approver set (generation, threshold, keys) for deployment, given the set
// in force. It returns the proposed set and the message signed.
func checkSetSignature(cur quorumwire.ApproverSet, deployment string, generation uint64, threshold int, keys [][]byte, approverKey, sig []byte) (quorumwire.ApproverSet, []byte, error) {
	none := quorumwire.ApproverSet{}
	if cur.Threshold == 0 {
		return none, nil, errs.New(errs.InvalidState, "no approvers are pinned; pin a set with `approvers pin` before nodes join")
	}
	if generation != cur.Generation+1 {
		return none, nil, errs.New(errs.InvalidInput, fmt.Sprintf("generation must be %d", cur.Generation+1))
	}
	next, err := quorumwire.NewApproverSet(generation, threshold, keys)
	if err != nil {
		return none, nil, errs.Wrap(errs.InvalidInput, "the new approver set is not valid", err)
	}
	if !cur.Contains(approverKey) {
		return none, nil, errs.New(errs.AccessDenied, "the key is not a current approver")
	}
	msg := quorumwire.ApproverSetMessage(deployment, next)
	if len(approverKey) != ed25519.PublicKeySize || !ed25519.Verify(ed25519.PublicKey(approverKey), msg, sig) {
		return none, nil, errs.New(errs.InvalidInput, "the signature does not verify over this approver set")
	}
	return next, msg, nil
}

// setChangeOutcome counts the valid signatures of cur's approvers over
// next and reports whether they carry the change, as a node would check it.
func setChangeOutcome(cur quorumwire.ApproverSet, deployment string, next quorumwire.ApproverSet, msg []byte, sigs []quorumwire.Signature) (signed int, applied bool) {
	_, err := quorumwire.NextApproverSet(cur, deployment, deployment, next.Generation, next.Threshold, next.RawKeys(), sigs)
	return countValid(cur, msg, sigs), err == nil
}

// replayChain moves pinned forward through the recorded changes, as a node
// does. A change that does not verify against the set before it ends the
// chain: broken is its index (-1 when every change verified) and err why.
func replayChain(pinned quorumwire.ApproverSet, deployment string, rows []setRow) (cur quorumwire.ApproverSet, broken int, err error) {
	cur = pinned
	for i, r := range rows {
		next, err := quorumwire.NextApproverSet(cur, deployment, deployment, r.generation, r.threshold, r.keys, r.sigs)
		if err != nil {
			return cur, i, err
		}
		cur = next
	}
	return cur, -1, nil
}
