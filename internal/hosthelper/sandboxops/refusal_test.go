package sandboxops_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/daemon/sandbox"
	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
	"github.com/bettercompute/bettercompute/internal/hosthelper/sandboxops"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// simFixture is Ops on a real sandbox host with the sim runtime (the
// verification under test is the same whatever the runtime).
type simFixture struct {
	now      time.Time
	clk      *clock.Fake
	s        signer
	host     *sandbox.Host
	stateDir string
	ops      *sandboxops.Ops
	digest   string
	store    string // the image store's URL
	hostDir  string // the host's state root
	sim      *sandbox.Sim
}

func newSimFixture(t testing.TB) simFixture {
	t.Helper()
	now := time.Now()
	clk := clock.NewFake(now)
	s := newSigner(t, now)
	store, digest := imageStore(t, tinyImage(t))
	hostDir, err := os.MkdirTemp("", "bcsbo-") // short: overlay options hold paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(hostDir) })
	sim := sandbox.NewSim()
	h := openHostIn(t, hostDir, func(string) sandbox.Runtime { return sim }, store, clk)
	dir := t.TempDir()
	return simFixture{now: now, clk: clk, s: s, host: h, stateDir: dir, ops: newOps(t, h, dir, clk, fixed(s.trust())), digest: digest,
		store: store, hostDir: hostDir, sim: sim}
}

func (f simFixture) create(t testing.TB, mut func(*nodev1.CommandBody)) ([]byte, spec.Create) {
	t.Helper()
	c := createPayload(f.digest, spec.RuntimeSim, f.now.Add(time.Hour))
	return f.s.command(t, f.now, "n1", kinds.SandboxCreate, c, mut), c
}

// TestCommandRefusals: every command the helper must not run is refused
// with CodeCommand and the daemon's exact reason, and nothing is created:
// no command, bytes that are no command, an unsigned command, a signature
// over another body, a signer not chained to the helper's roots, a
// command for another node, an expired one, a kind the role or the
// desired state's allowed kinds do not permit, a command sent as another
// operation than its kind, and a helper that trusts nothing.
func TestCommandRefusals(t *testing.T) {
	f := newSimFixture(t)
	ctx := context.Background()
	good, _ := f.create(t, nil)
	var sc nodev1.SignedCommand
	if err := proto.Unmarshal(good, &sc); err != nil {
		t.Fatal(err)
	}
	mutate := func(m func(*nodev1.SignedCommand)) []byte {
		c := proto.Clone(&sc).(*nodev1.SignedCommand)
		m(c)
		b, _ := proto.Marshal(c)
		return b
	}
	other := newSigner(t, f.now) // a PKI the helper does not pin
	otherSigned, _ := func() ([]byte, spec.Create) {
		c := createPayload(f.digest, spec.RuntimeSim, f.now.Add(time.Hour))
		return other.command(t, f.now, "n1", kinds.SandboxCreate, c, nil), c
	}()
	exec := f.s.command(t, f.now, "n1", kinds.SandboxExec, spec.Exec{SandboxID: "sbx-1", Argv: []string{"echo"}, TimeoutMS: 1000}, nil)
	wrongNode, _ := f.create(t, func(b *nodev1.CommandBody) { b.NodeId = "n2" })
	expired, _ := f.create(t, func(b *nodev1.CommandBody) {
		b.IssuedAtMs, b.ExpiresAtMs = f.now.Add(-50*time.Minute).UnixMilli(), f.now.Add(-40*time.Minute).UnixMilli()
	})
	tenantRole := f.s.trust()
	tenantRole.Role = pki.RoleNodeTenant
	narrowed := f.s.trust()
	narrowed.AllowedKinds = []string{kinds.SandboxExec}
	cases := []struct {
		name   string
		op     string
		cmd    []byte
		trust  *sandboxops.Trust
		reason string
	}{
		{"no command", helperwire.OpSandboxCreate, nil, nil, daemon.ReasonSignatureMissing},
		{"not a command", helperwire.OpSandboxCreate, []byte{0xff, 0xff, 0xff}, nil, daemon.ReasonBodyMalformed},
		{"unsigned", helperwire.OpSandboxCreate, mutate(func(c *nodev1.SignedCommand) { c.Signature = nil }), nil, daemon.ReasonSignatureMissing},
		{"signature over another body", helperwire.OpSandboxCreate, mutate(func(c *nodev1.SignedCommand) {
			c.Signature = ed25519.Sign(f.s.priv, []byte("something else"))
		}), nil, daemon.ReasonSignatureInvalid},
		{"signer of another PKI", helperwire.OpSandboxCreate, otherSigned, nil, daemon.ReasonSignerUntrusted},
		{"id not the body's", helperwire.OpSandboxCreate, mutate(func(c *nodev1.SignedCommand) { c.Id = "cmd-other" }), nil, daemon.ReasonIDMismatch},
		{"id too long", helperwire.OpSandboxCreate, mutate(func(c *nodev1.SignedCommand) { c.Id = string(make([]byte, 65)) }), nil, sandboxops.ReasonCommandID},
		{"another node", helperwire.OpSandboxCreate, wrongNode, nil, daemon.ReasonWrongNode},
		{"expired", helperwire.OpSandboxCreate, expired, nil, daemon.ReasonExpired},
		{"role without sandboxes", helperwire.OpSandboxCreate, good, &tenantRole, daemon.ReasonKindNotAllowed},
		{"kind not in allowed kinds", helperwire.OpSandboxCreate, good, &narrowed, daemon.ReasonKindNotAllowed},
		{"exec command as create", helperwire.OpSandboxCreate, exec, nil, sandboxops.ReasonOpKindMismatch},
		{"create command as delete", helperwire.OpSandboxDelete, good, nil, sandboxops.ReasonOpKindMismatch},
		{"helper without roots", helperwire.OpSandboxCreate, good, &sandboxops.Trust{NodeID: "n1", TrustDomain: f.s.td, Role: pki.RoleNode}, daemon.ReasonSignerUntrusted},
		{"helper without node id", helperwire.OpSandboxCreate, good, &sandboxops.Trust{TrustDomain: f.s.td, Roots: f.s.roots, Role: pki.RoleNode}, daemon.ReasonWrongNode},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := f.ops
			if c.trust != nil {
				o = newOps(t, f.host, t.TempDir(), f.clk, fixed(*c.trust))
			}
			_, err := o.Handlers()[c.op](ctx, req(c.op, c.cmd))
			wantRefusal(t, err, helperwire.CodeCommand, c.reason)
			if got := f.host.Sandboxes(); len(got) != 0 {
				t.Fatalf("a refused command made sandboxes %v", got)
			}
		})
	}
	// The refused commands consumed nothing: the good one still runs.
	if _, err := f.ops.Create(ctx, req(helperwire.OpSandboxCreate, good)); err != nil {
		t.Fatalf("good command after the refusals: %v", err)
	}
}

// TestReplayRefused: a command the helper ran is refused as replayed when
// sent again, by the same Ops and by a new Ops on the same state directory
// (a helper restart), and after the store is pruned while the command is
// still fresh; an expired entry is pruned.
func TestReplayRefused(t *testing.T) {
	f := newSimFixture(t)
	ctx := context.Background()
	cmd, c := f.create(t, nil)
	if _, err := f.ops.Create(ctx, req(helperwire.OpSandboxCreate, cmd)); err != nil {
		t.Fatal(err)
	}
	if got := f.host.Sandboxes(); len(got) != 1 || got[0] != c.SandboxID {
		t.Fatalf("sandboxes %v, want [%s]", got, c.SandboxID)
	}
	_, err := f.ops.Create(ctx, req(helperwire.OpSandboxCreate, cmd))
	wantRefusal(t, err, helperwire.CodeCommand, daemon.ReasonReplayed)
	restarted := newOps(t, f.host, f.stateDir, f.clk, fixed(f.s.trust()))
	_, err = restarted.Create(ctx, req(helperwire.OpSandboxCreate, cmd))
	wantRefusal(t, err, helperwire.CodeCommand, daemon.ReasonReplayed)

	seen, err := sandboxops.OpenSeen(filepath.Join(f.stateDir, "seen"))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := seen.Prune(f.now); err != nil || n != 0 {
		t.Fatalf("pruned %d (%v) fresh entries", n, err)
	}
	_, err = newOps(t, f.host, f.stateDir, f.clk, fixed(f.s.trust())).Create(ctx, req(helperwire.OpSandboxCreate, cmd))
	wantRefusal(t, err, helperwire.CodeCommand, daemon.ReasonReplayed)
	if n, err := seen.Prune(f.now.Add(10*time.Minute + daemon.MaxSkew + time.Second)); err != nil || n != 1 {
		t.Fatalf("pruned %d (%v), want the expired entry", n, err)
	}
	if ents, _ := os.ReadDir(filepath.Join(f.stateDir, "seen")); len(ents) != 0 {
		t.Fatalf("left %v", ents)
	}
}

// TestTrustRefusalPassesThrough: the trust function's refusal (the
// desired-state checker's) is the answer, and nothing runs.
func TestTrustRefusalPassesThrough(t *testing.T) {
	f := newSimFixture(t)
	o := newOps(t, f.host, t.TempDir(), f.clk, func(context.Context, *helperwire.Request) (sandboxops.Trust, error) {
		return sandboxops.Trust{}, &helperwire.Refusal{Code: helperwire.CodeIntentOtherNode}
	})
	cmd, _ := f.create(t, nil)
	_, err := o.Create(context.Background(), req(helperwire.OpSandboxCreate, cmd))
	wantRefusal(t, err, helperwire.CodeIntentOtherNode, "")
	if len(f.host.Sandboxes()) != 0 {
		t.Fatal("a refused intent made a sandbox")
	}
}

// TestHostReasonPassesThrough: an admitted command the host fails answers
// CodeFailed with the host's own reason (sandbox-not-found), as the node's
// in-process host gave it.
func TestHostReasonPassesThrough(t *testing.T) {
	f := newSimFixture(t)
	cmd := f.s.command(t, f.now, "n1", kinds.SandboxExec, spec.Exec{SandboxID: ids.New("sbx"), Argv: []string{"echo"}, TimeoutMS: 1000}, nil)
	_, err := f.ops.Exec(context.Background(), req(helperwire.OpSandboxExec, cmd))
	wantRefusal(t, err, helperwire.CodeFailed, "sandbox-not-found")
	raw, err := f.ops.Labels(context.Background(), req(helperwire.OpSandboxLabels, nil))
	var l helperwire.SandboxLabels
	if err != nil || json.Unmarshal(raw, &l) != nil || l.Labels[spec.RuntimeLabel(spec.RuntimeSim)] != "true" {
		t.Fatalf("labels %s (%v)", raw, err)
	}
}
