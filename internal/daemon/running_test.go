package daemon

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// waitLimit bounds every wait below; reaching it fails the test (it is not
// a timing assertion: nothing is expected to take that long).
const waitLimit = 20 * time.Second

// openTestNode writes a data directory as Join leaves it (join record with
// the signed trust bundle of f's PKI, node key, node certificate for n1)
// and opens it with daemon.Open, on the sim driver and a clock stopped at
// f.now.
func openTestNode(t *testing.T, f fixture, runningAfter time.Duration) (*Node, *driver.Sim, *ecdsa.PrivateKey) {
	t.Helper()
	b := f.bundle
	joinKey, err := b.JoinSigningKey(f.kek)
	if err != nil {
		t.Fatal(err)
	}
	body, err := pki.EncodeTrustBundle(b.TrustBundle(f.now))
	if err != nil {
		t.Fatal(err)
	}
	caKey, err := b.NodeCAKey(f.kek)
	if err != nil {
		t.Fatal(err)
	}
	key, err := pki.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.CSR(key, "n1")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := pki.IssueNodeCert(b.NodeCA, caKey, csr, b.TrustDomain, "n1", pki.RoleNode, 24*time.Hour, f.now.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := pki.MarshalPrivateKeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	joinPub := joinKey.Public().(ed25519.PublicKey)
	pin := sha256.Sum256(joinPub)
	if err := writeJSON(dir, identityFile, identity{KeyPEM: keyPEM, Chain: [][]byte{cert}}); err != nil {
		t.Fatal(err)
	}
	if err := writeJSON(dir, joinFile, &JoinRecord{NodeID: "n1", Gateway: "127.0.0.1:1", Pin: pin[:], JoinPublicKey: joinPub,
		BundleBody: body, BundleSig: pki.SignTrustBundle(joinKey, body)}); err != nil {
		t.Fatal(err)
	}
	sim := driver.NewSim("n1")
	n, err := Open(Config{DataDir: dir, Driver: sim, Clock: clock.NewFake(f.now), Log: slog.New(slog.DiscardHandler), RunningAfter: runningAfter})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n, sim, key
}

// executor feeds commands to the node's execute loop, as a session does,
// and collects the updates it sends, checking each one's node signature:
// those the worker sends itself (running updates, replay answers) and the
// final ones it hands to the node's outbox, which the executor sends as a
// session's loop does.
type executor struct {
	t       *testing.T
	key     *ecdsa.PrivateKey
	work    chan *nodev1.SignedCommand
	sent    chan *nodev1.UpdateBody
	done    chan struct{}
	drained chan struct{}
	stopOut chan struct{}
	cancel  context.CancelFunc
}

// startExecutor runs n.execute with fetch as the secret broker until stop.
func startExecutor(t *testing.T, n *Node, key *ecdsa.PrivateKey, fetch func(ctx context.Context, commandID, ref string) ([]byte, error)) *executor {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	e := &executor{t: t, key: key, work: make(chan *nodev1.SignedCommand), sent: make(chan *nodev1.UpdateBody, 16), done: make(chan struct{}),
		drained: make(chan struct{}), stopOut: make(chan struct{}), cancel: cancel}
	var mu sync.Mutex
	send := func(m *nodev1.NodeMessage) error {
		mu.Lock()
		defer mu.Unlock()
		u := m.GetUpdate()
		var b nodev1.UpdateBody
		if u == nil || proto.Unmarshal(u.Body, &b) != nil {
			t.Errorf("sent %v, not an update", m)
			return nil
		}
		digest := sha256.Sum256(append([]byte(wire.UpdateSigContext), u.Body...))
		if !ecdsa.VerifyASN1(&key.PublicKey, digest[:], u.NodeSig) {
			t.Errorf("update %s/%s does not carry the node's signature", b.CommandId, b.State)
		}
		e.sent <- &b
		return nil
	}
	go func() {
		defer close(e.done)
		n.execute(ctx, e.work, send, nil, false, fetch)
	}()
	go func() {
		defer close(e.drained)
		rt := &resendTimer{clk: n.cfg.Clock}
		defer rt.stop()
		for {
			select {
			case <-n.outbox.wake:
				_ = n.flushResults(send, rt)
			case <-e.stopOut:
				_ = n.flushResults(send, rt)
				return
			}
		}
	}()
	t.Cleanup(e.stop)
	return e
}

// next waits for the next update the node sends.
func (e *executor) next() *nodev1.UpdateBody {
	e.t.Helper()
	return receive(e.t, e.sent)
}

// finish ends the execute loop once every command given is handled, and
// fails the test if any update is left that the test did not take.
func (e *executor) finish() {
	e.t.Helper()
	close(e.work)
	select {
	case <-e.done:
	case <-time.After(waitLimit):
		e.t.Fatalf("execute did not return within %v", waitLimit)
	}
	close(e.stopOut)
	<-e.drained
	close(e.sent)
	for b := range e.sent {
		e.t.Errorf("unexpected extra update %s/%s", b.CommandId, b.State)
	}
	e.work = nil
}

func (e *executor) stop() {
	e.cancel()
	if e.work != nil {
		close(e.work)
		e.work = nil
		<-e.done
		close(e.stopOut)
		<-e.drained
	}
}

// receive waits for a value on ch.
func receive[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitLimit):
		t.Fatalf("nothing received within %v", waitLimit)
		var zero T
		return zero
	}
}

// waitTimers waits until at least n timers wait on clk, so that the test
// moves the clock only once the node waits on it.
func waitTimers(t *testing.T, clk *clock.Fake, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := clk.BlockUntil(ctx, n); err != nil {
		t.Fatalf("%d timers did not start within %v", n, waitLimit)
	}
}

func noSecrets(context.Context, string, string) ([]byte, error) {
	return nil, errors.New("no secrets in this test")
}

func command(f fixture, id, kind string, payload []byte) *nodev1.SignedCommand {
	return f.sign(f.body(func(b *nodev1.CommandBody) { b.CommandId, b.Kind, b.Payload = id, kind, payload }))
}

func wantUpdate(t *testing.T, b *nodev1.UpdateBody, id, state, reason string) {
	t.Helper()
	if b.CommandId != id || b.NodeId != "n1" || b.State != state || b.Reason != reason {
		t.Fatalf("update %s/%s (reason %q), want %s/%s (reason %q)", b.CommandId, b.State, b.Reason, id, state, reason)
	}
}

// TestRunningOnlyAfterRunningAfter checks when a node reports a command
// "running": a command whose driver returns within Config.RunningAfter
// sends exactly one update, its final one; a command still running then
// sends "running" and later its final state, in that order, with its
// journal "start" durable before the driver began (the delay runs on the
// node's injected clock, a fake here, so no test waits on wall time); a
// negative RunningAfter
// reports running at once; and a command whose context ends while the
// driver runs is not reported running but still finishes with its final
// update. Commands go through the node's own execute loop (verification,
// journal, sim driver, signed updates); secret.digest blocks in the
// secret fetch for as long as the test wants the driver to run.
func TestRunningOnlyAfterRunningAfter(t *testing.T) {
	t.Run("fast command sends only its final update", func(t *testing.T) {
		f := newFixture(t)
		// The node's clock is a fake that this test never moves, so the
		// running delay cannot pass, however slow the machine running the
		// test: the sim's diag.run returns first.
		n, sim, key := openTestNode(t, f, DefaultRunningAfter)
		e := startExecutor(t, n, key, noSecrets)
		e.work <- command(f, "c-fast", kinds.DiagRun, []byte("{}"))
		wantUpdate(t, e.next(), "c-fast", "succeeded", "")
		e.finish()
		if sim.Runs(kinds.DiagRun) != 1 {
			t.Fatalf("diag.run ran %d times", sim.Runs(kinds.DiagRun))
		}
		if got := n.journal.Unacked(); len(got) != 1 || got[0].ID != "c-fast" {
			t.Fatalf("journal unacked = %+v, want c-fast done", got)
		}
	})

	t.Run("slow command sends running then its final update", func(t *testing.T) {
		f := newFixture(t)
		n, _, key := openTestNode(t, f, time.Minute)
		clk := n.cfg.Clock.(*clock.Fake)
		entered, release := make(chan string, 1), make(chan struct{})
		e := startExecutor(t, n, key, func(ctx context.Context, commandID, ref string) ([]byte, error) {
			// The driver is running: its start must be journaled already.
			started := false
			for _, r := range n.journal.Interrupted() {
				started = started || r.ID == commandID
			}
			if !started {
				t.Errorf("driver runs %s before its journal start", commandID)
			}
			entered <- commandID
			select {
			case <-release:
				return []byte("value"), nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		})
		e.work <- command(f, "c-slow", kinds.SecretDigest, []byte(`{"ref":"r1","nonce":"000102030405060708090a0b0c0d0e0f"}`))
		if id := receive(t, entered); id != "c-slow" {
			t.Fatalf("fetch for %s", id)
		}
		// The running delay waits on the node's (fake) clock: it has not
		// passed a nanosecond early, and it passes when the clock reaches
		// it, with no wall time spent.
		waitTimers(t, clk, 1)
		clk.Advance(time.Minute - time.Nanosecond)
		if clk.Waiters() != 1 {
			t.Fatal("the running delay passed before RunningAfter")
		}
		clk.Advance(time.Nanosecond)
		// The driver cannot return before release, so the first update is
		// the running one, sent once RunningAfter passed.
		wantUpdate(t, e.next(), "c-slow", "running", "")
		close(release)
		final := e.next()
		wantUpdate(t, final, "c-slow", "succeeded", "")
		mac := hmac.New(sha256.New, []byte("value"))
		mac.Write([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
		var res map[string]string
		if err := json.Unmarshal(final.Result, &res); err != nil || res["hmac_sha256"] != hex.EncodeToString(mac.Sum(nil)) {
			t.Fatalf("result %s (%v)", final.Result, err)
		}
		e.finish()
	})

	t.Run("negative RunningAfter reports running at once", func(t *testing.T) {
		f := newFixture(t)
		n, _, key := openTestNode(t, f, -1)
		e := startExecutor(t, n, key, noSecrets)
		e.work <- command(f, "c-now", kinds.DiagRun, []byte("{}"))
		wantUpdate(t, e.next(), "c-now", "running", "")
		wantUpdate(t, e.next(), "c-now", "succeeded", "")
		e.finish()
	})

	t.Run("cancelled while running finishes without a running update", func(t *testing.T) {
		f := newFixture(t)
		n, _, key := openTestNode(t, f, time.Hour)
		entered := make(chan string, 1)
		e := startExecutor(t, n, key, func(ctx context.Context, commandID, _ string) ([]byte, error) {
			entered <- commandID
			<-ctx.Done()
			return nil, ctx.Err()
		})
		e.work <- command(f, "c-cancel", kinds.SecretDigest, []byte(`{"ref":"r1","nonce":"000102030405060708090a0b0c0d0e0f"}`))
		if id := receive(t, entered); id != "c-cancel" {
			t.Fatalf("fetch for %s", id)
		}
		e.cancel()
		wantUpdate(t, e.next(), "c-cancel", "failed", "secret-refused")
		e.finish()
		if got := n.journal.Interrupted(); len(got) != 0 {
			t.Fatalf("journal interrupted = %+v, want the command done", got)
		}
	})
}

// TestRunningAfterDefault checks that Open makes a zero RunningAfter the
// documented default.
func TestRunningAfterDefault(t *testing.T) {
	n, _, _ := openTestNode(t, newFixture(t), 0)
	if n.cfg.RunningAfter != DefaultRunningAfter || DefaultRunningAfter != time.Second {
		t.Fatalf("RunningAfter = %v, want %v (1 s)", n.cfg.RunningAfter, DefaultRunningAfter)
	}
}

// TestAckOfRunningUpdateLeavesResultUnacked checks that the gateway's ack
// of a "running" update (it acks every update it records) does not mark
// the command acknowledged: its final update stays in the journal to be
// sent again until an ack with a final state arrives.
func TestAckOfRunningUpdateLeavesResultUnacked(t *testing.T) {
	f := newFixture(t)
	n, _, key := openTestNode(t, f, -1)
	e := startExecutor(t, n, key, noSecrets)
	e.work <- command(f, "c1", kinds.DiagRun, []byte("{}"))
	wantUpdate(t, e.next(), "c1", "running", "")
	if err := n.acknowledge(&nodev1.UpdateAck{CommandId: "c1", State: "running"}); err != nil {
		t.Fatal(err)
	}
	wantUpdate(t, e.next(), "c1", "succeeded", "")
	e.finish()
	if got := n.journal.Unacked(); len(got) != 1 || got[0].ID != "c1" {
		t.Fatalf("unacked after the running ack = %+v, want c1", got)
	}
	if err := n.acknowledge(&nodev1.UpdateAck{CommandId: "c1", State: "succeeded"}); err != nil {
		t.Fatal(err)
	}
	if got := n.journal.Unacked(); len(got) != 0 {
		t.Fatalf("unacked after the final ack = %+v, want none", got)
	}
}
