package daemon

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/quorum/quorumwire"
)

// frameFixture is what FuzzServerFrame checks frames against: the
// verifier's fixture, one command and one time statement the workers
// signed, and a pinned approver set with the one change its approvers
// signed.
type frameFixture struct {
	fixture
	good     *nodev1.SignedCommand
	goodTime *nodev1.SignedTimeStatement
	pinned   quorumwire.ApproverSet
	next     quorumwire.ApproverSet
	change   *nodev1.SignedApproverSet
}

const frameDeployment = "dep-fuzz"

func newFrameFixture(f testing.TB) frameFixture {
	fx := newFixture(f)
	pub1, priv1, _ := ed25519.GenerateKey(rand.Reader)
	pub2, priv2, _ := ed25519.GenerateKey(rand.Reader)
	pinned, err := quorumwire.NewApproverSet(0, 2, [][]byte{pub1, pub2})
	if err != nil {
		f.Fatal(err)
	}
	next, err := quorumwire.NewApproverSet(1, 1, [][]byte{pub1})
	if err != nil {
		f.Fatal(err)
	}
	msg := quorumwire.ApproverSetMessage(frameDeployment, next)
	change := &nodev1.SignedApproverSet{Deployment: frameDeployment, Generation: 1, Threshold: 1, Keys: next.RawKeys(),
		Signatures: []*nodev1.ApproverSignature{
			{PublicKey: pub1, Signature: ed25519.Sign(priv1, msg)},
			{PublicKey: pub2, Signature: ed25519.Sign(priv2, msg)},
		}}
	return frameFixture{fixture: fx, good: fx.sign(fx.body(nil)), goodTime: timeSigner(f, fx.bundle, fx.kek)(fx.now),
		pinned: pinned, next: next, change: change}
}

// frameSeeds are session frames of every kind the gateway sends, genuine
// and broken.
func (fx frameFixture) frameSeeds() []*nodev1.ServerMessage {
	underQuorum := proto.Clone(fx.change).(*nodev1.SignedApproverSet)
	underQuorum.Signatures = underQuorum.Signatures[:1]
	return []*nodev1.ServerMessage{
		{Msg: &nodev1.ServerMessage_Command{Command: fx.good}},
		{Msg: &nodev1.ServerMessage_Command{Command: &nodev1.SignedCommand{Id: "c2", Body: fx.good.Body, Signature: fx.good.Signature, SignerCertDer: fx.good.SignerCertDer}}},
		{Msg: &nodev1.ServerMessage_Welcome{Welcome: &nodev1.Welcome{SessionId: "s1", Time: fx.goodTime, ApproverSets: []*nodev1.SignedApproverSet{fx.change}}}},
		{Msg: &nodev1.ServerMessage_ApproverSets{ApproverSets: &nodev1.ApproverSets{Sets: []*nodev1.SignedApproverSet{fx.change, fx.change}}}},
		{Msg: &nodev1.ServerMessage_ApproverSets{ApproverSets: &nodev1.ApproverSets{Sets: []*nodev1.SignedApproverSet{underQuorum}}}},
		{Msg: &nodev1.ServerMessage_Ack{Ack: &nodev1.UpdateAck{CommandId: "c1", State: "succeeded"}}},
		{Msg: &nodev1.ServerMessage_SandboxAck{SandboxAck: &nodev1.SandboxReportAck{SandboxId: "sb1"}}},
		{Msg: &nodev1.ServerMessage_Ping{Ping: &nodev1.Ping{TimeMs: 1}}},
	}
}

// FuzzServerFrame feeds arbitrary session frames, as the node receives
// them from a gateway, through what the node does with each kind before it
// acts: a command through the verifier, a Welcome's time statement through
// CheckTime and its approver-set chain, like an ApproverSets frame's,
// through the pinned set. No frame panics, and nothing is accepted that
// the workers or the approvers did not sign: a command only as the signed
// envelope's body under its own id, a time only as the signed statement,
// and an approver-set change only as the one the pinned quorum signed.
func FuzzServerFrame(f *testing.F) {
	fx := newFrameFixture(f)
	for _, m := range fx.frameSeeds() {
		raw, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(raw)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var m nodev1.ServerMessage
		if proto.Unmarshal(raw, &m) != nil {
			return
		}
		switch msg := m.Msg.(type) {
		case *nodev1.ServerMessage_Command:
			c := msg.Command
			body, reason := fx.v.Check(c, fx.now, nil, never)
			if reason == "" && (!bytes.Equal(c.Body, fx.good.Body) || !bytes.Equal(c.Signature, fx.good.Signature) || body.GetCommandId() != c.Id) {
				t.Fatalf("accepted a command the workers did not sign: id %q", c.Id)
			}
		case *nodev1.ServerMessage_Welcome:
			if st := msg.Welcome.GetTime(); st != nil {
				if _, err := fx.v.CheckTime(st); err == nil && (!bytes.Equal(st.Body, fx.goodTime.Body) || !bytes.Equal(st.Signature, fx.goodTime.Signature)) {
					t.Fatal("accepted a time statement the workers did not sign")
				}
			}
			fx.checkSets(t, msg.Welcome.GetApproverSets())
		case *nodev1.ServerMessage_ApproverSets:
			fx.checkSets(t, msg.ApproverSets.GetSets())
		}
	})
}

// checkSets applies changes in order to a node's approvers pinned at
// fx.pinned, as applyApproverSets does, and fails the test if any change
// but the signed one is adopted, or a refused one changes the set.
func (fx frameFixture) checkSets(t *testing.T, sets []*nodev1.SignedApproverSet) {
	a := &approvers{deployment: frameDeployment, set: fx.pinned}
	for _, s := range sets {
		before := a.current()
		changed, reason := a.apply(s)
		after := a.current()
		if changed && !sameSet(after, fx.next) {
			t.Fatalf("adopted an approver set the quorum did not sign: %+v", after)
		}
		if !changed && !sameSet(after, before) {
			t.Fatalf("set changed without a change adopted (reason %q)", reason)
		}
		if reason != "" {
			return
		}
	}
}

func sameSet(a, b quorumwire.ApproverSet) bool {
	return a.Generation == b.Generation && a.Threshold == b.Threshold &&
		slices.EqualFunc(a.Keys, b.Keys, func(x, y ed25519.PublicKey) bool { return bytes.Equal(x, y) })
}
