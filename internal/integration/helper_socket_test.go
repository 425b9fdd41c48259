package integration

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/hosthelper"
	"github.com/bettercompute/bettercompute/internal/hosthelper/helperconfig"
	"github.com/bettercompute/bettercompute/internal/hosthelper/helperd"
	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// helperNodeUID is the node account the in-process helpers of these
// tests serve (no account is needed: the test itself calls as root).
const helperNodeUID = 65533

// nodeIntent starts n and returns the first desired state its session
// brings (signed bytes), failing on a refusal.
func nodeIntent(t *testing.T, n *testenv.Node) []byte {
	t.Helper()
	got := make(chan error, 8)
	n.Node.OnIntent(func(_ uint64, err error) { got <- err })
	n.Start(t)
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("desired state refused: %v", err)
		}
	case <-time.After(testenv.WaitTimeout):
		t.Fatal("no desired state within the wait limit")
	}
	return n.Node.Intent()
}

// serveHelper runs an assembled helper (helperd, as bcd helper --config
// does) on a real socket in a root-only directory and returns a client.
// The test process, root running the helper's own executable, passes the
// caller checks; the refusals below are the helper's own.
func serveHelper(t *testing.T, cfg helperconfig.Config) *helperwire.Client {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h, err := helperd.Open(ctx, helperd.Options{Config: cfg, NodeUID: helperNodeUID, NodeGID: helperNodeUID, Log: testenv.Logger(t), Clock: clock.Real{}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := hosthelper.Listen(cfg.Socket, 0, helperNodeUID)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- h.Server.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done; h.Close() })
	return &helperwire.Client{Socket: cfg.Socket}
}

// helperBase is a fresh root-only directory tree for a helper: its
// socket directory and sshd directory, every parent root's and closed.
func helperBase(t *testing.T) string {
	t.Helper()
	base, err := os.MkdirTemp(rootOnlyParent(t), "bcd-helper-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	for _, d := range []string{base, filepath.Join(base, "sock"), filepath.Join(base, "sshd")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return base
}

// helperConfigFor is a helper configuration pinned to e's command root
// and join key, on the sim driver, with no sandboxes.
func helperConfigFor(e *testenv.Env, base string) helperconfig.Config {
	_, _, joinPub, _ := e.CP.Nodes.TrustBundle()
	cfg := helperconfig.Default()
	cfg.Socket, cfg.StateDir, cfg.SSHDDir, cfg.Driver = filepath.Join(base, "sock", "helper.sock"), filepath.Join(base, "state"), filepath.Join(base, "sshd"), "sim"
	cfg.CommandRootSHA256 = []string{sha256Hex(e.Bundle.CommandRoot.Raw)}
	cfg.JoinKeyPin = hex.EncodeToString(joinPub)
	return cfg
}

// jsonRaw is v as JSON.
func jsonRaw(v any) (json.RawMessage, error) { return json.Marshal(v) }

// wantHelperCode fails unless err is a helper refusal with code.
func wantHelperCode(t *testing.T, what string, err error, code string) {
	t.Helper()
	var r *helperwire.Refusal
	if !errors.As(err, &r) || r.Code != code {
		t.Fatalf("%s: %v, want refusal %s", what, err, code)
	}
}

// TestHelperRefusalsThroughSocket (issue 17's bad input, through the real
// socket and the assembled helper): a host-changing request without a
// signed desired state, with another node's (also another than root's
// node_id), with an older generation, or one signed under a key root did
// not pin, each refused with its exact code before its signed command is
// looked at; raw file writes, rulesets, GPU resets and reboots are not
// served at all (op-unknown): only signed commands change the host.
func TestHelperRefusalsThroughSocket(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("BC_REQUIRE_ROOT") == "1" {
			t.Fatal("root is required (BC_REQUIRE_ROOT=1)")
		}
		t.Skip("the helper needs root")
	}
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		a, b := e.Join(t, pki.RoleNode, "helped-a"), e.Join(t, pki.RoleNode, "helped-b")
		intentA, intentB := nodeIntent(t, a), nodeIntent(t, b)
		bundle := a.Node.TrustBundle()
		base := helperBase(t)
		cfg := helperConfigFor(e, base)
		c := serveHelper(t, cfg)
		ctx := context.Background()
		call := func(op string, intent []byte, args any) error {
			var raw json.RawMessage
			if args != nil {
				raw, _ = jsonRaw(args)
			}
			_, err := c.Call(ctx, &helperwire.Request{Op: op, Intent: intent, Bundle: bundle, Args: raw})
			return err
		}
		// ssh.access is a host-changing operation: the desired state is
		// checked before its signed command.
		op := helperwire.OpSSHAccess
		wantHelperCode(t, "no desired state", call(op, nil, nil), helperwire.CodeIntentMissing)
		err := call(op, intentA, nil)
		var r *helperwire.Refusal
		if !errors.As(err, &r) || r.Code != helperwire.CodeCommand || r.Reason != daemon.ReasonSignatureMissing {
			t.Fatalf("node a's desired state without a signed command: %v, want %s/%s", err, helperwire.CodeCommand, daemon.ReasonSignatureMissing)
		}
		wantHelperCode(t, "another node's desired state", call(op, intentB, nil), helperwire.CodeIntentOtherNode)
		// Raw file writes, rulesets, GPU resets and reboots are not served
		// on the socket at all (only signed commands change the host).
		for _, unserved := range []string{helperwire.OpFileWrite, helperwire.OpFileRemove, helperwire.OpFirewallApply, helperwire.OpGPUReset, helperwire.OpReboot} {
			wantHelperCode(t, unserved, call(unserved, intentA, map[string]string{}), helperwire.CodeUnknownOp)
		}

		// A helper whose root named node b refuses a's state even first
		// (no trust on first use when node_id is set).
		bcfg := helperConfigFor(e, helperBase(t))
		bcfg.NodeID = b.NodeID()
		bc := serveHelper(t, bcfg)
		_, err = bc.Call(ctx, &helperwire.Request{Op: op, Intent: intentA, Bundle: bundle})
		wantHelperCode(t, "another node than root's node_id", err, helperwire.CodeIntentOtherNode)

		// An older generation: narrowing a's kinds raises it.
		serial := a.Node.Serial()
		a.Stop()
		if err := e.CP.Nodes.RestrictCert(ctx, audit.Entry{TenantID: iam.RootTenant, Actor: "test"}, a.NodeID(), serial, []string{"diag.run"}); err != nil {
			t.Fatal(err)
		}
		a2 := e.OpenNode(t, a.Dir, "boot-2")
		var newer []byte
		got := make(chan error, 8)
		a2.Node.OnIntent(func(g uint64, err error) {
			if g == 2 {
				got <- err
			}
		})
		a2.Start(t)
		select {
		case err := <-got:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(testenv.WaitTimeout):
			t.Fatal("no generation 2")
		}
		newer = a2.Node.Intent()
		if err := call(op, newer, nil); !errors.As(err, &r) || r.Code != helperwire.CodeCommand {
			t.Fatalf("generation 2: %v, want it past the desired-state check", err)
		}
		wantHelperCode(t, "an older generation", call(op, intentA, nil), helperwire.CodeIntentRewound)

		// Signed under a key root did not pin: a worker of another
		// command root, for this node and a newer generation.
		other, err := pki.Init(t.TempDir(), e.Bundle.TrustDomain, e.KEK, e.Clock)
		if err != nil {
			t.Fatal(err)
		}
		otherKey, err := other.CommandRootKey(e.KEK)
		if err != nil {
			t.Fatal(err)
		}
		sign := testenv.SignerFromRoot(t, other.CommandRoot, otherKey, e.Bundle.TrustDomain, e.Clock.Now())
		body, _ := proto.Marshal(&nodev1.DesiredState{NodeId: a.NodeID(), Generation: 9, TrustDomain: e.Bundle.TrustDomain,
			IssuedAtMs: e.Clock.Now().UnixMilli(), Host: &nodev1.HostSection{Role: pki.RoleNode}})
		sig, cert := sign(body)
		forged, _ := proto.Marshal(&nodev1.SignedDesiredState{Body: body, Signature: sig, SignerCertDer: cert})
		wantHelperCode(t, "signed by an unpinned key", call(op, forged, nil), helperwire.CodeIntentUntrusted)
		if err := call(op, newer, nil); !errors.As(err, &r) || r.Code != helperwire.CodeCommand {
			t.Fatalf("generation 2 after the forgery: %v (the forged generation 9 must not count)", err)
		}
	})
}
