package daemon

import (
	"bytes"
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/quorum/quorumwire"
)

// Reasons bcd reports when it refuses a command (state cancelled). They are
// part of the API: tests and operators match on them.
const (
	ReasonSignatureMissing = "signature-missing"
	ReasonBodyMalformed    = "body-malformed"
	ReasonSignerUntrusted  = "signer-untrusted"
	ReasonSignatureInvalid = "signature-invalid"
	ReasonIDMismatch       = "id-mismatch"
	ReasonWrongNode        = "wrong-node"
	ReasonExpired          = "expired"
	ReasonNotYetValid      = "not-yet-valid"
	ReasonReplayed         = "replayed"
	ReasonKindNotAllowed   = "kind-not-allowed"
	// ReasonClockRewound: the session's signed time statement is more
	// than MaxSkew behind the highest this node accepted (an old statement
	// replayed), so nothing on the session runs.
	ReasonClockRewound = "welcome-time-rewound"
	// ReasonClockAhead: the body's expiry has passed by the node's own
	// clock, which is more than MaxSkew ahead of the signed time the node
	// holds, and by that signed time it has not: the node's clock is
	// ahead. Refused all the same, since a signed time is only a lower
	// bound; the reason says which clock to fix.
	ReasonClockAhead = "node-clock-ahead"

	// The node cannot journal the command, so it does not run it (a
	// command runs only after its start entry is fsynced). The refusal
	// itself is journaled when it can be, else kept in memory and sent
	// (see journal.ErrNotDurable).

	// ReasonDataDirFull: the data folder has less than
	// Config.MinFreeBytes free, or a journal write failed with ENOSPC or
	// EDQUOT.
	ReasonDataDirFull = "data-dir-full"
	// ReasonDataDirReadOnly: a journal write failed with EROFS.
	ReasonDataDirReadOnly = "data-dir-read-only"
	// ReasonJournalUnwritable: a journal write failed otherwise (EIO,
	// EACCES, ...).
	ReasonJournalUnwritable = "journal-unwritable"

	// Destructive-batch quorum (docs/quorum.md), checked only after all of
	// the above, for kinds.Destructive kinds.

	// ReasonUnbatchedDestructive: a destructive kind whose signed body
	// names no batch.
	ReasonUnbatchedDestructive = "unbatched-destructive"
	// ReasonBatchMismatch: the approval is for another batch id or
	// another deployment than the signed body and the pinned bundle.
	ReasonBatchMismatch = "batch-mismatch"
	// ReasonApproverUnpinned: the approval carries a signature by a key
	// that is not a pinned approver.
	ReasonApproverUnpinned = "approver-unpinned"
	// ReasonBatchUnderQuorum: fewer distinct pinned approvers validly
	// signed (deployment, batch, root, expiry) than the threshold (no
	// approval at all counts as none).
	ReasonBatchUnderQuorum = "batch-under-quorum"
	// ReasonBatchExpired: the approved batch's expiry has passed.
	ReasonBatchExpired = "batch-expired"
	// ReasonLeafNotInBatch: no proven leaf admits this node, kind and
	// payload digest (nor an unbound leaf of this kind for this node).
	ReasonLeafNotInBatch = "leaf-not-in-batch"
	// ReasonProofWrongRoot: the inclusion proof does not lead to the
	// approved root.
	ReasonProofWrongRoot = "proof-wrong-root"
)

// Reasons bcd gives when it refuses a change of the approver set; they are
// logged and reported to OnApproverSet, and the set in force stays.
const (
	ReasonSetUnpinned        = "approver-set-unpinned"         // signed by a key outside the current set (the join key, say)
	ReasonSetUnderQuorum     = "approver-set-under-quorum"     // fewer than the current threshold signed
	ReasonSetReplayed        = "approver-set-replayed"         // generation not newer than the set in force
	ReasonSetMalformed       = "approver-set-malformed"        // not a valid set (keys, threshold)
	ReasonSetWrongDeployment = "approver-set-wrong-deployment" // for another deployment
)

// Freshness bounds: a body may be issued at most MaxSkew in the future of
// the node's clock and live at most MaxLifetime. A signed time statement
// up to MaxClockCorrection ahead of the node's own clock sets the node's
// time in this process (a slow clock is corrected); one more than MaxSkew
// ahead is never saved, and one more than MaxClockCorrection ahead is
// refused (see Node.acceptWelcome).
const (
	MaxSkew            = 5 * time.Minute
	MaxLifetime        = 24 * time.Hour
	MaxClockCorrection = time.Hour
)

// Verifier checks signed commands against what this node pinned at join.
type Verifier struct {
	NodeID      string
	Role        string
	TrustDomain string
	// CommandRoots are the pinned command-signing roots (see CurrentRoots).
	CommandRoots []*x509.Certificate
	// Deployment is the pinned trust bundle's deployment, which batch
	// approvals must name.
	Deployment string
	// Approvers returns the approver set in force (the trust bundle's, or a
	// later one its quorum signed). Nil, or a set without keys, means no
	// destructive command ever passes.
	Approvers func() quorumwire.ApproverSet
	// WorkerChains, when set, memoises the worker-chain verification
	// (every command a worker key signs carries the same certificate). It
	// answers exactly as pki.VerifyWorkerChain for these roots and trust
	// domain; nil verifies every chain in full.
	WorkerChains *pki.WorkerChainCache

	// CurrentRoots, when set, returns the command roots in force and
	// replaces CommandRoots: a trust-bundle refresh (refresh.go) changes
	// them for every check from then on.
	CurrentRoots func() []*x509.Certificate
}

// commandRoots returns the command roots in force.
func (v *Verifier) commandRoots() []*x509.Certificate {
	if v.CurrentRoots != nil {
		return v.CurrentRoots()
	}
	return v.CommandRoots
}

// workerKey verifies the signer certificate at the issue time, through the
// memo when there is one.
func (v *Verifier) workerKey(der []byte, issued time.Time) (ed25519.PublicKey, error) {
	return v.WorkerChains.Verify(der, v.commandRoots(), v.TrustDomain, issued)
}

// Check verifies a signed command at time now and returns its body, or the
// reason it is refused. allowed narrows the role's kinds (nil: no
// narrowing); seen reports a replayed id. The order matters: nothing in
// the body is trusted before the signature and its chain verify.
func (v *Verifier) Check(c *nodev1.SignedCommand, now time.Time, allowed []string, seen func(string) bool) (*nodev1.CommandBody, string) {
	if len(c.GetSignature()) == 0 || len(c.GetSignerCertDer()) == 0 {
		return nil, ReasonSignatureMissing
	}
	var body nodev1.CommandBody
	if err := proto.Unmarshal(c.GetBody(), &body); err != nil {
		return nil, ReasonBodyMalformed
	}
	issued := time.UnixMilli(body.IssuedAtMs)
	pub, err := v.workerKey(c.SignerCertDer, issued)
	if err != nil {
		return nil, ReasonSignerUntrusted
	}
	if !ed25519.Verify(pub, append([]byte(wire.CommandSigContext), c.Body...), c.Signature) {
		return nil, ReasonSignatureInvalid
	}
	// From here on the body is the worker's word.
	switch {
	case body.CommandId != c.Id:
		return &body, ReasonIDMismatch
	case body.NodeId != v.NodeID:
		return &body, ReasonWrongNode
	case body.IssuedAtMs > now.Add(MaxSkew).UnixMilli():
		return &body, ReasonNotYetValid
	case body.ExpiresAtMs <= now.UnixMilli(), body.ExpiresAtMs-body.IssuedAtMs > MaxLifetime.Milliseconds():
		return &body, ReasonExpired
	case seen(body.CommandId):
		return &body, ReasonReplayed
	case !kinds.Permitted(v.Role, allowed, body.Kind):
		return &body, ReasonKindNotAllowed
	}
	if kinds.Destructive(body.Kind) {
		return &body, v.checkBatch(c, &body, now)
	}
	return &body, ""
}

// CheckKept verifies again a signed command the node ran earlier and a
// driver kept (a marshalled nodev1.SignedCommand; a sandbox host keeps
// the signed spec of each sandbox): signed by a worker key whose
// certificate chained to the command roots in force at the command's
// issue time, for this node, of kind. Freshness and replay are not
// checked: the command was admitted once and is read again, not run. It
// returns the command's payload, or an error naming the refusal reason.
func (v *Verifier) CheckKept(signed []byte, kind string) ([]byte, error) {
	var c nodev1.SignedCommand
	if err := proto.Unmarshal(signed, &c); err != nil {
		return nil, errors.New(ReasonBodyMalformed)
	}
	if len(c.GetSignature()) == 0 || len(c.GetSignerCertDer()) == 0 {
		return nil, errors.New(ReasonSignatureMissing)
	}
	var body nodev1.CommandBody
	if err := proto.Unmarshal(c.GetBody(), &body); err != nil {
		return nil, errors.New(ReasonBodyMalformed)
	}
	pub, err := v.workerKey(c.SignerCertDer, time.UnixMilli(body.IssuedAtMs))
	if err != nil {
		return nil, errors.New(ReasonSignerUntrusted)
	}
	if !ed25519.Verify(pub, append([]byte(wire.CommandSigContext), c.Body...), c.Signature) {
		return nil, errors.New(ReasonSignatureInvalid)
	}
	switch {
	case body.CommandId != c.Id:
		return nil, errors.New(ReasonIDMismatch)
	case body.NodeId != v.NodeID:
		return nil, errors.New(ReasonWrongNode)
	case body.Kind != kind:
		return nil, errors.New(ReasonKindNotAllowed)
	}
	return body.Payload, nil
}

// Errors of CheckTime. The node ignores such a statement (it keeps its
// own clock) and logs why.
var (
	ErrTimeUnsigned   = errors.New("daemon: time statement missing or unsigned")
	ErrTimeMalformed  = errors.New("daemon: time statement malformed")
	ErrTimeUntrusted  = errors.New("daemon: time statement signer not chained to the command-signing roots")
	ErrTimeBadSig     = errors.New("daemon: time statement signature does not verify")
	ErrTimeOtherTrust = errors.New("daemon: time statement for another trust domain")
)

// CheckTime verifies a worker's signed time statement, as Check does a
// command: the signer certificate must chain to the pinned command roots
// at the stated time and its key must have signed the exact body bytes
// under wire.TimeSigContext. It returns the stated time, which proves only
// that the time is at least that (a statement can be replayed later).
func (v *Verifier) CheckTime(st *nodev1.SignedTimeStatement) (time.Time, error) {
	if len(st.GetSignature()) == 0 || len(st.GetSignerCertDer()) == 0 {
		return time.Time{}, ErrTimeUnsigned
	}
	var body nodev1.TimeStatement
	if err := proto.Unmarshal(st.GetBody(), &body); err != nil || body.ServerTimeMs <= 0 {
		return time.Time{}, ErrTimeMalformed
	}
	at := time.UnixMilli(body.ServerTimeMs)
	pub, err := v.workerKey(st.SignerCertDer, at)
	if err != nil {
		return time.Time{}, ErrTimeUntrusted
	}
	if !ed25519.Verify(pub, append([]byte(wire.TimeSigContext), st.Body...), st.Signature) {
		return time.Time{}, ErrTimeBadSig
	}
	if body.TrustDomain != v.TrustDomain {
		return time.Time{}, ErrTimeOtherTrust
	}
	return at, nil
}

// checkBatch checks that an authenticated destructive command belongs to a
// batch the pinned approvers' quorum signed for this deployment, that the
// batch has not expired, and that the inclusion proof puts a leaf for this
// node, kind and payload (or an unbound leaf of this kind for this node)
// under the approved root. Only body is trusted here; approval and proof
// are the control plane's word until they check out.
func (v *Verifier) checkBatch(c *nodev1.SignedCommand, body *nodev1.CommandBody, now time.Time) string {
	if body.BatchId == "" {
		return ReasonUnbatchedDestructive
	}
	ap := c.GetApproval()
	if ap == nil {
		return ReasonBatchUnderQuorum
	}
	if ap.BatchId != body.BatchId || ap.Deployment != v.Deployment {
		return ReasonBatchMismatch
	}
	var set quorumwire.ApproverSet
	if v.Approvers != nil {
		set = v.Approvers()
	}
	sigs := make([]quorumwire.Signature, 0, len(ap.Signatures))
	for _, s := range ap.Signatures {
		sigs = append(sigs, quorumwire.Signature{PublicKey: s.GetPublicKey(), Signature: s.GetSignature()})
	}
	switch err := quorumwire.CheckQuorum(set, quorumwire.ApprovalMessage(ap.Deployment, ap.BatchId, ap.Root, ap.ExpiresAtMs), sigs); {
	case errors.Is(err, quorumwire.ErrUnpinned):
		return ReasonApproverUnpinned
	case err != nil:
		return ReasonBatchUnderQuorum
	}
	if ap.ExpiresAtMs <= now.UnixMilli() {
		return ReasonBatchExpired
	}
	pr := c.GetProof()
	if pr == nil {
		return ReasonLeafNotInBatch
	}
	leaf, err := quorumwire.DecodeLeaf(pr.Leaf)
	if err != nil || !leaf.Admits(v.NodeID, body.Kind, body.Payload) {
		return ReasonLeafNotInBatch
	}
	root, err := quorumwire.RootFromProof(leaf, pr.LeafIndex, pr.TreeSize, pr.Hashes)
	if err != nil || !bytes.Equal(root, ap.Root) {
		return ReasonProofWrongRoot
	}
	return ""
}
