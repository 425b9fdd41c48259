package daemon_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/desiredstate"
	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// waitIntent starts n and waits for the first desired state its session
// brings; it fails the test on a refusal.
func waitIntent(t *testing.T, n *testenv.Node) uint64 {
	t.Helper()
	got := make(chan error, 8)
	gens := make(chan uint64, 8)
	n.Node.OnIntent(func(g uint64, err error) { gens <- g; got <- err })
	n.Start(t)
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("desired state refused: %v", err)
		}
		return <-gens
	case <-time.After(testenv.WaitTimeout):
		t.Fatal("no desired state within the wait limit")
		return 0
	}
}

// The control plane signs and sends a node's desired state on every
// session; the node keeps it; the root helper's checker verifies it under
// the pinned command root; narrowing the certificate's kinds raises the
// generation, and the helper then refuses the old one.
func TestControlPlaneSendsSignedDesiredState(t *testing.T) {
	storetest.ForEachDialect(t, testControlPlaneSendsSignedDesiredState)
}

func testControlPlaneSendsSignedDesiredState(t *testing.T, db *store.DB) {
	e := testenv.Start(t, db, testenv.Options{})
	n := e.Join(t, "node", "intent")
	if g := waitIntent(t, n); g != 1 {
		t.Fatalf("first generation %d, want 1", g)
	}
	first := n.Node.Intent()
	var sd nodev1.SignedDesiredState
	var body nodev1.DesiredState
	if err := proto.Unmarshal(first, &sd); err != nil || proto.Unmarshal(sd.Body, &body) != nil {
		t.Fatalf("kept desired state does not decode: %v", err)
	}
	if body.NodeId != n.NodeID() || body.TrustDomain != e.Bundle.TrustDomain || body.Host.GetRole() != "node" {
		t.Fatalf("body %v", &body)
	}
	// The helper takes its roots from the bundle the node presents,
	// checked under the join key root pinned.
	_, _, bpub, _ := e.CP.Nodes.TrustBundle()
	bundle := n.Node.TrustBundle()
	checker, err := desiredstate.New(desiredstate.Config{PinnedRootSHA256: [][32]byte{sha256.Sum256(e.Bundle.CommandRoot.Raw)},
		JoinKeyPin: bpub, NodeID: n.NodeID, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := checker.Check(first, bundle); err != nil {
		t.Fatalf("helper refused the control plane's desired state: %v", err)
	}

	serial := n.Node.Serial()
	n.Stop()
	if err := e.CP.Nodes.RestrictCert(context.Background(), audit.Entry{TenantID: "root", Actor: "test"}, n.NodeID(), serial, []string{"diag.run"}); err != nil {
		t.Fatal(err)
	}
	n2 := e.OpenNode(t, n.Dir, "boot-2")
	if g := n2.Node.IntentGeneration(); g != 1 {
		t.Fatalf("kept generation %d after restart, want 1", g)
	}
	if g := waitIntent(t, n2); g != 2 {
		t.Fatalf("generation %d after narrowing, want 2", g)
	}
	second := n2.Node.Intent()
	ds, err := checker.Check(second, nil)
	if err != nil {
		t.Fatalf("helper refused generation 2: %v", err)
	}
	if !slices.Equal(ds.Host.GetAllowedKinds(), []string{"diag.run"}) {
		t.Fatalf("allowed kinds %v", ds.Host.GetAllowedKinds())
	}
	_, err = checker.Check(first, nil)
	var r *helperwire.Refusal
	if !errors.As(err, &r) || r.Code != helperwire.CodeIntentRewound {
		t.Fatalf("old desired state: %v, want %s", err, helperwire.CodeIntentRewound)
	}
}
