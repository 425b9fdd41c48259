// Package quorumwire holds the wire formats and checks of the
// destructive-batch quorum: the bytes the control plane, the approvers'
// command line and bcd must agree on exactly.
//
//   - A leaf names one (node, kind, payload digest), or one (node, kind)
//     for any payload ("unbound"), in a canonical binary encoding.
//   - A batch's root is the RFC 6962 Merkle root over its leaves in order
//     (github.com/transparency-dev/merkle), and a command travels with the
//     inclusion proof of its own leaf.
//   - An approver signs (deployment, batch id, root, expiry).
//   - The current approvers sign a new approver set (deployment,
//     generation, threshold, sorted keys), so the join key alone can never
//     replace them.
//
// The package holds no key and no state; it is pure so that bcd can check
// everything the control plane sends without trusting it. See
// docs/quorum.md for the byte layouts.
package quorumwire

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/transparency-dev/merkle/compact"
	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"

	"github.com/bettercompute/bettercompute/internal/pki"
)

// Signature contexts: each signed or hashed message starts with one, so a
// signature made for one purpose never verifies for another.
const (
	LeafContext        = "bc-batch-leaf-v1\x00"
	ApprovalContext    = "bc-batch-approval-v1\x00"
	ApproverSetContext = "bc-approver-set-v1\x00"
)

// Limits on what a node accepts from the control plane.
const (
	MaxApprovers     = 32                 // keys in an approver set
	MaxSignatures    = 2 * MaxApprovers   // signatures carried with an approval or set change
	MaxLeaves        = 4096               // leaves in a batch
	MaxProofHashes   = 64                 // hashes in an inclusion proof
	MaxKindLength    = 128                // bytes of a kind in a leaf
	MaxIDLength      = 128                // bytes of a batch id or deployment in a signed message
	MaxBatchLifetime = 7 * 24 * time.Hour // longest a batch may stay approvable
)

// Sentinel errors of the checks; test with errors.Is.
var (
	// ErrUnpinned: a signature is by a key that is not in the approver set.
	ErrUnpinned = errors.New("quorumwire: signature by a key that is not a pinned approver")
	// ErrUnderQuorum: fewer distinct pinned approvers signed than the threshold.
	ErrUnderQuorum = errors.New("quorumwire: fewer valid approvals than the threshold")
	// ErrReplayed: an approver-set change whose generation is not newer.
	ErrReplayed = errors.New("quorumwire: approver-set generation is not newer than the current one")
	// ErrMalformed: a leaf, proof or set that does not decode or validate.
	ErrMalformed = errors.New("quorumwire: malformed")
	// ErrWrongDeployment: a message for another deployment.
	ErrWrongDeployment = errors.New("quorumwire: message is for another deployment")
)

// MaxPayload bounds a bound leaf's payload, as commands bound theirs.
const MaxPayload = 64 << 10

// CanonicalPayload is the payload bytes a bound leaf and a batched command
// digest: compact JSON, "{}" when empty, at most MaxPayload. The control
// plane stores a batched command's payload in this form, so the bytes the
// worker signs are the bytes the leaf's digest names.
func CanonicalPayload(p []byte) ([]byte, error) {
	if len(p) == 0 {
		return []byte("{}"), nil
	}
	if len(p) > MaxPayload {
		return nil, errors.New("quorumwire: payload larger than 64 KiB")
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, p); err != nil {
		return nil, fmt.Errorf("quorumwire: payload: %w", err)
	}
	return buf.Bytes(), nil
}

// hasher is RFC 6962's SHA-256 Merkle hasher; it is stateless.
var hasher = rfc6962.DefaultHasher

// Leaf is one entry of a batch: the command kind for a node, bound to one
// payload's SHA-256, or Unbound (any payload of that kind for that node),
// which every display flags.
type Leaf struct {
	NodeID        string   `json:"node_id"`
	Kind          string   `json:"kind"`
	Unbound       bool     `json:"unbound"`
	PayloadSHA256 [32]byte `json:"-"` // zero when Unbound
}

// Leaf flag bytes in the encoding.
const (
	flagBound   = 0x00
	flagUnbound = 0x01
)

// BoundLeaf is the leaf admitting exactly payload for (nodeID, kind).
func BoundLeaf(nodeID, kind string, payload []byte) Leaf {
	return Leaf{NodeID: nodeID, Kind: kind, PayloadSHA256: sha256.Sum256(payload)}
}

// UnboundLeaf is the leaf admitting any payload of kind for nodeID.
func UnboundLeaf(nodeID, kind string) Leaf { return Leaf{NodeID: nodeID, Kind: kind, Unbound: true} }

func validKind(k string) bool {
	if len(k) == 0 || len(k) > MaxKindLength {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// Validate checks the leaf's fields: a valid node id, a kind of
// [A-Za-z0-9._-]{1,128}, and a zero digest when unbound.
func (l Leaf) Validate() error {
	if !pki.ValidNodeID(l.NodeID) {
		return fmt.Errorf("%w: leaf node id", ErrMalformed)
	}
	if !validKind(l.Kind) {
		return fmt.Errorf("%w: leaf kind", ErrMalformed)
	}
	if l.Unbound && l.PayloadSHA256 != ([32]byte{}) {
		return fmt.Errorf("%w: unbound leaf carries a digest", ErrMalformed)
	}
	return nil
}

// Encode returns the canonical leaf bytes:
//
//	"bc-batch-leaf-v1\x00" || u8 len(node) || node || u8 len(kind) || kind ||
//	0x00 || sha256(payload)      (bound)
//	0x01                         (unbound)
func (l Leaf) Encode() []byte {
	b := make([]byte, 0, len(LeafContext)+2+len(l.NodeID)+len(l.Kind)+1+32)
	b = append(b, LeafContext...)
	b = append(b, byte(len(l.NodeID)))
	b = append(b, l.NodeID...)
	b = append(b, byte(len(l.Kind)))
	b = append(b, l.Kind...)
	if l.Unbound {
		return append(b, flagUnbound)
	}
	b = append(b, flagBound)
	return append(b, l.PayloadSHA256[:]...)
}

// DecodeLeaf parses untrusted leaf bytes strictly: anything that is not
// exactly the Encode of a valid leaf is ErrMalformed.
func DecodeLeaf(b []byte) (Leaf, error) {
	bad := fmt.Errorf("%w: leaf encoding", ErrMalformed)
	rest, ok := bytes.CutPrefix(b, []byte(LeafContext))
	if !ok {
		return Leaf{}, bad
	}
	take := func() (string, bool) {
		if len(rest) < 1 || len(rest) < 1+int(rest[0]) {
			return "", false
		}
		s := string(rest[1 : 1+int(rest[0])])
		rest = rest[1+int(rest[0]):]
		return s, true
	}
	var l Leaf
	if l.NodeID, ok = take(); !ok {
		return Leaf{}, bad
	}
	if l.Kind, ok = take(); !ok {
		return Leaf{}, bad
	}
	switch {
	case len(rest) == 1 && rest[0] == flagUnbound:
		l.Unbound = true
	case len(rest) == 33 && rest[0] == flagBound:
		copy(l.PayloadSHA256[:], rest[1:])
	default:
		return Leaf{}, bad
	}
	if err := l.Validate(); err != nil {
		return Leaf{}, err
	}
	return l, nil
}

// Hash is the RFC 6962 leaf hash of the canonical encoding.
func (l Leaf) Hash() []byte { return hasher.HashLeaf(l.Encode()) }

// Admits reports whether the leaf covers a command of kind for nodeID with
// payload: the same node and kind, and the payload's digest or unbound.
func (l Leaf) Admits(nodeID, kind string, payload []byte) bool {
	if l.NodeID != nodeID || l.Kind != kind {
		return false
	}
	return l.Unbound || l.PayloadSHA256 == sha256.Sum256(payload)
}

func leafHashes(leaves []Leaf) ([][]byte, error) {
	if len(leaves) == 0 || len(leaves) > MaxLeaves {
		return nil, fmt.Errorf("%w: a batch holds 1..%d leaves", ErrMalformed, MaxLeaves)
	}
	hs := make([][]byte, len(leaves))
	for i, l := range leaves {
		if err := l.Validate(); err != nil {
			return nil, fmt.Errorf("leaf %d: %w", i, err)
		}
		hs[i] = l.Hash()
	}
	return hs, nil
}

// subtreeRoot is the Merkle root over hashes (the leaf hashes of one range).
func subtreeRoot(hashes [][]byte) ([]byte, error) {
	rf := compact.RangeFactory{Hash: hasher.HashChildren}
	r := rf.NewEmptyRange(0)
	for _, h := range hashes {
		if err := r.Append(h, nil); err != nil {
			return nil, fmt.Errorf("quorumwire: merkle append: %w", err)
		}
	}
	return r.GetRootHash(nil)
}

// Root is the RFC 6962 Merkle root over the leaves in order.
func Root(leaves []Leaf) ([]byte, error) {
	hs, err := leafHashes(leaves)
	if err != nil {
		return nil, err
	}
	return subtreeRoot(hs)
}

// Prove returns the inclusion proof of leaves[index] in the tree over leaves.
func Prove(leaves []Leaf, index int) ([][]byte, error) {
	hs, err := leafHashes(leaves)
	if err != nil {
		return nil, err
	}
	if index < 0 || index >= len(hs) {
		return nil, fmt.Errorf("%w: leaf index out of range", ErrMalformed)
	}
	nodes, err := proof.Inclusion(uint64(index), uint64(len(hs)))
	if err != nil {
		return nil, fmt.Errorf("quorumwire: inclusion nodes: %w", err)
	}
	out := make([][]byte, len(nodes.IDs))
	for i, id := range nodes.IDs {
		begin, end := id.Coverage()
		end = min(end, uint64(len(hs)))
		if out[i], err = subtreeRoot(hs[begin:end]); err != nil {
			return nil, err
		}
	}
	return nodes.Rehash(out, hasher.HashChildren)
}

// RootFromProof is the root that an inclusion proof of leaf at index in a
// tree of size leads to. It fails on a proof of the wrong shape.
func RootFromProof(leaf Leaf, index, size uint64, hashes [][]byte) ([]byte, error) {
	if size == 0 || size > MaxLeaves || len(hashes) > MaxProofHashes {
		return nil, fmt.Errorf("%w: proof size", ErrMalformed)
	}
	for _, h := range hashes {
		if len(h) != sha256.Size {
			return nil, fmt.Errorf("%w: proof hash size", ErrMalformed)
		}
	}
	root, err := proof.RootFromInclusionProof(hasher, index, size, leaf.Hash(), hashes)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return root, nil
}

// appendLP appends a 16-bit big-endian length and s.
func appendLP(b []byte, s []byte) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// ApprovalMessage is what an approver signs for a batch:
//
//	"bc-batch-approval-v1\x00" || u16 len || deployment || u16 len || batch id ||
//	u16 len || root || i64 big-endian expiry (unix ms)
func ApprovalMessage(deployment, batchID string, root []byte, expiresAtMS int64) []byte {
	b := append([]byte(nil), ApprovalContext...)
	b = appendLP(b, []byte(deployment))
	b = appendLP(b, []byte(batchID))
	b = appendLP(b, root)
	return binary.BigEndian.AppendUint64(b, uint64(expiresAtMS))
}

// Signature is one approver's Ed25519 signature and its public key.
type Signature struct {
	PublicKey []byte `json:"public_key"`
	Signature []byte `json:"signature"`
}

// ApproverSet is the approvers a node pins: Ed25519 keys in ascending byte
// order, the threshold k of distinct signatures a batch needs, and the
// generation (0 for the set in the trust bundle, then one more per change).
type ApproverSet struct {
	Generation uint64
	Threshold  int
	Keys       []ed25519.PublicKey
}

// NewApproverSet sorts keys and checks the set: 1..MaxApprovers distinct
// 32-byte keys and 1 <= threshold <= len(keys).
func NewApproverSet(generation uint64, threshold int, keys [][]byte) (ApproverSet, error) {
	s := ApproverSet{Generation: generation, Threshold: threshold}
	for _, k := range keys {
		s.Keys = append(s.Keys, ed25519.PublicKey(bytes.Clone(k)))
	}
	slices.SortFunc(s.Keys, func(a, b ed25519.PublicKey) int { return bytes.Compare(a, b) })
	return s, s.Validate()
}

// Validate checks that keys are 1..MaxApprovers distinct 32-byte keys in
// ascending order and 1 <= threshold <= len(keys).
func (s ApproverSet) Validate() error {
	if len(s.Keys) == 0 || len(s.Keys) > MaxApprovers {
		return fmt.Errorf("%w: an approver set holds 1..%d keys", ErrMalformed, MaxApprovers)
	}
	for i, k := range s.Keys {
		if len(k) != ed25519.PublicKeySize {
			return fmt.Errorf("%w: approver key %d is not a 32-byte Ed25519 key", ErrMalformed, i)
		}
		if i > 0 && bytes.Compare(s.Keys[i-1], k) >= 0 {
			return fmt.Errorf("%w: approver keys must be distinct and sorted", ErrMalformed)
		}
	}
	if s.Threshold < 1 || s.Threshold > len(s.Keys) {
		return fmt.Errorf("%w: threshold must be 1..%d", ErrMalformed, len(s.Keys))
	}
	return nil
}

// Contains reports whether pub is one of the set's keys.
func (s ApproverSet) Contains(pub []byte) bool {
	return slices.ContainsFunc(s.Keys, func(k ed25519.PublicKey) bool { return bytes.Equal(k, pub) })
}

// RawKeys returns the keys as byte slices (for the wire).
func (s ApproverSet) RawKeys() [][]byte {
	out := make([][]byte, len(s.Keys))
	for i, k := range s.Keys {
		out[i] = bytes.Clone(k)
	}
	return out
}

// ApproverSetMessage is what the current approvers sign for a new set:
//
//	"bc-approver-set-v1\x00" || u16 len || deployment || u64 generation ||
//	u32 threshold || u32 count || keys (32 bytes each, ascending)
func ApproverSetMessage(deployment string, s ApproverSet) []byte {
	b := append([]byte(nil), ApproverSetContext...)
	b = appendLP(b, []byte(deployment))
	b = binary.BigEndian.AppendUint64(b, s.Generation)
	b = binary.BigEndian.AppendUint32(b, uint32(s.Threshold))
	b = binary.BigEndian.AppendUint32(b, uint32(len(s.Keys)))
	for _, k := range s.Keys {
		b = append(b, k...)
	}
	return b
}

// CheckQuorum checks sigs over msg against set: any signature by a key
// outside the set is ErrUnpinned (refused, not ignored, so a forged
// approval is visible); otherwise fewer than set.Threshold distinct keys
// with a valid signature is ErrUnderQuorum. A set without a threshold
// (nothing pinned) never has a quorum.
func CheckQuorum(set ApproverSet, msg []byte, sigs []Signature) error {
	if len(sigs) > MaxSignatures {
		return fmt.Errorf("%w: too many signatures", ErrMalformed)
	}
	for _, s := range sigs {
		if !set.Contains(s.PublicKey) {
			return ErrUnpinned
		}
	}
	seen := map[string]bool{}
	for _, s := range sigs {
		if seen[string(s.PublicKey)] || !ed25519.Verify(ed25519.PublicKey(s.PublicKey), msg, s.Signature) {
			continue
		}
		seen[string(s.PublicKey)] = true
	}
	if set.Threshold < 1 || len(seen) < set.Threshold {
		return ErrUnderQuorum
	}
	return nil
}

// NextApproverSet checks a change of the approver set against the current
// one: the change must be for deployment, newer than current (ErrReplayed
// otherwise), a valid set (ErrMalformed), and signed by at least
// current.Threshold of current's keys and by no other key (CheckQuorum's
// errors). It returns the new set.
func NextApproverSet(current ApproverSet, deployment, changeDeployment string, generation uint64, threshold int, keys [][]byte, sigs []Signature) (ApproverSet, error) {
	if changeDeployment != deployment {
		return ApproverSet{}, ErrWrongDeployment
	}
	if generation <= current.Generation {
		return ApproverSet{}, ErrReplayed
	}
	if len(keys) > MaxApprovers {
		return ApproverSet{}, fmt.Errorf("%w: too many keys", ErrMalformed)
	}
	next := ApproverSet{Generation: generation, Threshold: threshold}
	for _, k := range keys {
		next.Keys = append(next.Keys, ed25519.PublicKey(k))
	}
	if err := next.Validate(); err != nil {
		return ApproverSet{}, err
	}
	if err := CheckQuorum(current, ApproverSetMessage(deployment, next), sigs); err != nil {
		return ApproverSet{}, err
	}
	return next, nil
}
