package daemon

import (
	"context"
	"crypto/ed25519"
	"errors"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/atomicfile"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// intentFile holds the last signed desired state the node verified, as the
// exact marshalled SignedDesiredState it received (0600, written
// atomically), so the root helper can check the worker's signature itself.
const intentFile = "host-intent.pb"

// Errors of CheckDesiredState and of taking a desired state. The node
// keeps the one it holds, and logs why.
var (
	ErrIntentUnsigned   = errors.New("daemon: desired state missing or unsigned")
	ErrIntentMalformed  = errors.New("daemon: desired state malformed")
	ErrIntentUntrusted  = errors.New("daemon: desired state signer not chained to the command-signing roots")
	ErrIntentBadSig     = errors.New("daemon: desired state signature does not verify")
	ErrIntentOtherTrust = errors.New("daemon: desired state for another trust domain")
	ErrIntentOtherNode  = errors.New("daemon: desired state for another node")
	ErrIntentRewound    = errors.New("daemon: desired state older than the one held")
)

// CheckDesiredState verifies a worker's signed desired state as CheckTime
// does a time statement: the signer certificate must chain to the pinned
// command roots at the state's issue time, its key must have signed the
// exact body bytes under wire.DesiredStateSigContext, and only then is the
// body read: this trust domain and this node.
func (v *Verifier) CheckDesiredState(sd *nodev1.SignedDesiredState) (*nodev1.DesiredState, error) {
	if len(sd.GetSignature()) == 0 || len(sd.GetSignerCertDer()) == 0 {
		return nil, ErrIntentUnsigned
	}
	var body nodev1.DesiredState
	if err := proto.Unmarshal(sd.GetBody(), &body); err != nil || body.IssuedAtMs <= 0 {
		return nil, ErrIntentMalformed
	}
	pub, err := v.workerKey(sd.SignerCertDer, time.UnixMilli(body.IssuedAtMs))
	if err != nil {
		return nil, ErrIntentUntrusted
	}
	if !ed25519.Verify(pub, append([]byte(wire.DesiredStateSigContext), sd.Body...), sd.Signature) {
		return nil, ErrIntentBadSig
	}
	switch {
	case body.TrustDomain != v.TrustDomain:
		return nil, ErrIntentOtherTrust
	case body.NodeId != v.NodeID:
		return nil, ErrIntentOtherNode
	}
	return &body, nil
}

// Intent returns the last signed desired state the node verified (a
// marshalled nodev1.SignedDesiredState), nil when it holds none yet. Every
// helper call that changes the host carries it.
func (n *Node) Intent() []byte {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]byte(nil), n.intent...)
}

// TrustBundle returns the trust bundle the node pins now (its join
// record's, or a later one a refresh took), as the marshalled
// nodev1.SignedTrustBundle the root helper takes its command roots from
// (after checking the join key's signature itself).
func (n *Node) TrustBundle() []byte {
	rec, _ := n.pinned.get()
	raw, err := proto.Marshal(&nodev1.SignedTrustBundle{Body: rec.BundleBody, Signature: rec.BundleSig, JoinPublicKey: rec.JoinPublicKey})
	if err != nil {
		return nil
	}
	return raw
}

// IntentGeneration returns the generation of the desired state held (0
// when none).
func (n *Node) IntentGeneration() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.intentGen
}

// OnIntent sets a function told of every desired state a session
// brought: its generation and nil when taken, else why it was refused
// (tests wait on it instead of sleeping).
func (n *Node) OnIntent(f func(generation uint64, err error)) {
	n.mu.Lock()
	n.onIntent = f
	n.mu.Unlock()
}

// loadIntent reads the desired state kept in the data folder. One that no
// longer verifies (roots rotated, file damaged) is dropped and logged: the
// next session brings a fresh one.
func (n *Node) loadIntent() {
	raw, err := os.ReadFile(filepath.Join(n.cfg.DataDir, intentFile))
	if err != nil {
		return
	}
	var sd nodev1.SignedDesiredState
	if err := proto.Unmarshal(raw, &sd); err != nil {
		n.cfg.Log.Warn("kept desired state dropped", "err", ErrIntentMalformed)
		return
	}
	body, err := n.verify.CheckDesiredState(&sd)
	if err != nil {
		n.cfg.Log.Warn("kept desired state dropped", "err", err)
		return
	}
	n.mu.Lock()
	n.intent, n.intentGen = raw, body.Generation
	n.mu.Unlock()
}

// acceptDesiredState verifies a desired state the session sent and keeps
// it (memory and intentFile) unless it is older than the one held; an
// equal generation replaces it (a fresh signature of the same host
// section). A refusal is logged with a constant message and the state
// held stays.
func (n *Node) acceptDesiredState(sd *nodev1.SignedDesiredState) error {
	gen, err := n.takeDesiredState(sd)
	if err == nil {
		// The root helper adopts only with a desired state to check.
		n.adoptSandboxes(context.Background())
	}
	n.mu.Lock()
	f := n.onIntent
	n.mu.Unlock()
	if f != nil {
		f(gen, err)
	}
	return err
}

// takeDesiredState is acceptDesiredState without the observer.
func (n *Node) takeDesiredState(sd *nodev1.SignedDesiredState) (uint64, error) {
	body, err := n.verify.CheckDesiredState(sd)
	var raw []byte
	if err == nil {
		if raw, err = (proto.MarshalOptions{Deterministic: true}).Marshal(sd); err != nil {
			err = ErrIntentMalformed
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if err == nil && n.intent != nil && body.Generation < n.intentGen {
		err = ErrIntentRewound
	}
	if err != nil {
		n.cfg.Log.Warn("desired state refused", "err", err)
		return 0, err
	}
	if err := atomicfile.Write(filepath.Join(n.cfg.DataDir, intentFile), raw, 0o600); err != nil {
		n.cfg.Log.Warn("desired state not kept", "err", err)
		return 0, err
	}
	n.intent, n.intentGen = raw, body.Generation
	n.cfg.Log.Info("desired state taken", "generation", body.Generation)
	return body.Generation, nil
}
