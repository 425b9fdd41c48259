package daemon

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// intentSigner signs desired states with a worker key f's command root
// certified, as the control plane's workers do.
func intentSigner(t *testing.T, f fixture) func(node string, gen uint64, mut func(*nodev1.SignedDesiredState)) *nodev1.SignedDesiredState {
	t.Helper()
	rk, err := f.bundle.CommandRootKey(f.kek)
	if err != nil {
		t.Fatal(err)
	}
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	cert, err := pki.IssueWorkerCert(f.bundle.CommandRoot, rk, f.bundle.TrustDomain, "w-intent", pub, 24*time.Hour, f.now.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return func(node string, gen uint64, mut func(*nodev1.SignedDesiredState)) *nodev1.SignedDesiredState {
		body, _ := proto.MarshalOptions{Deterministic: true}.Marshal(&nodev1.DesiredState{NodeId: node, Generation: gen,
			TrustDomain: f.bundle.TrustDomain, IssuedAtMs: f.now.UnixMilli(), Host: &nodev1.HostSection{Role: pki.RoleNode}})
		sd := &nodev1.SignedDesiredState{Body: body, Signature: ed25519.Sign(priv, append([]byte(wire.DesiredStateSigContext), body...)), SignerCertDer: cert}
		if mut != nil {
			mut(sd)
		}
		return sd
	}
}

// deliverIntent hands sd to n as a session's message is handed.
func deliverIntent(t *testing.T, n *Node, sd *nodev1.SignedDesiredState) {
	t.Helper()
	if stop, err := n.dispatch(context.Background(), &nodev1.ServerMessage{Msg: &nodev1.ServerMessage_DesiredState{DesiredState: sd}}, nil); stop || err != nil {
		t.Fatalf("dispatch: stop %v err %v", stop, err)
	}
}

func TestNodeKeepsDesiredStateAcrossRestart(t *testing.T) {
	f := newFixture(t)
	n, _, _ := openTestNode(t, f, 0)
	sign := intentSigner(t, f)
	if n.Intent() != nil {
		t.Fatal("a fresh node holds a desired state")
	}
	deliverIntent(t, n, sign("n1", 3, nil))
	if n.IntentGeneration() != 3 {
		t.Fatalf("generation %d, want 3", n.IntentGeneration())
	}
	fi, err := os.Stat(filepath.Join(n.cfg.DataDir, intentFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s: %v %v", intentFile, fi, err)
	}
	held := n.Intent()
	n.Close()
	n2, err := Open(Config{DataDir: n.cfg.DataDir, Driver: driver.NewSim("n1"), Clock: clock.NewFake(f.now), Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer n2.Close()
	if n2.IntentGeneration() != 3 || string(n2.Intent()) != string(held) {
		t.Fatalf("after restart: generation %d", n2.IntentGeneration())
	}
	// Refused after the restart, each by its own reason; the kept state stays.
	other := sign("n1", 9, nil)
	other.Signature = append([]byte(nil), other.Signature...)
	other.Signature[0] ^= 1
	for _, tc := range []struct {
		name string
		sd   *nodev1.SignedDesiredState
		want error
	}{
		{"older", sign("n1", 2, nil), ErrIntentRewound},
		{"other-node", sign("n2", 9, nil), ErrIntentOtherNode},
		{"bad-signature", other, ErrIntentBadSig},
		{"unsigned", sign("n1", 9, func(sd *nodev1.SignedDesiredState) { sd.Signature = nil }), ErrIntentUnsigned},
		{"not-a-worker", sign("n1", 9, func(sd *nodev1.SignedDesiredState) { sd.SignerCertDer = f.bundle.CommandRoot.Raw }), ErrIntentUntrusted},
	} {
		if err := n2.acceptDesiredState(tc.sd); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		deliverIntent(t, n2, tc.sd) // the session path logs and goes on
		if n2.IntentGeneration() != 3 {
			t.Fatalf("%s: generation became %d", tc.name, n2.IntentGeneration())
		}
	}
	// The same generation again, and a newer one, are taken.
	deliverIntent(t, n2, sign("n1", 3, nil))
	deliverIntent(t, n2, sign("n1", 4, nil))
	if n2.IntentGeneration() != 4 {
		t.Fatalf("generation %d, want 4", n2.IntentGeneration())
	}
}
