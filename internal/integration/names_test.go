package integration

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// A node cannot name itself with terminal controls, spaces, a path or
// look-alike characters: the join is refused (reason name-invalid) and the
// token stays unspent, so the machine can join again under a good name. A
// join token's name follows the same rule (INVALID_INPUT).
func TestJoinRefusesUnsafeName(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Clock: clock.NewFake(time.Now())})
		ctx := context.Background()
		tok, err := e.CP.Nodes.CreateJoinToken(ctx, admin, "node", "", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"box\x1b]0;pwned\a", "box\u009b2J", "a b", "../etc", "-flag", "bоx" /* Cyrillic о */} {
			_, err := daemon.Join(ctx, daemon.JoinOptions{DataDir: filepath.Join(t.TempDir(), "n"), Gateway: e.CP.GatewayAddr, Token: tok.Token, Name: name})
			if status.Code(errors.Unwrap(err)) != codes.PermissionDenied {
				t.Fatalf("join as %q: got %v, want ACCESS_DENIED", name, err)
			}
		}
		if !hasReason(t, e, nodes.EventJoinRefused, "name-invalid") {
			t.Fatal("no name-invalid refusal recorded")
		}
		if _, err := daemon.Join(ctx, daemon.JoinOptions{DataDir: filepath.Join(t.TempDir(), "n"), Gateway: e.CP.GatewayAddr, Token: tok.Token, Name: "gpu-01.rack_2"}); err != nil {
			t.Fatalf("the token was spent by a refused join: %v", err)
		}
		if _, err := e.CP.Nodes.CreateJoinToken(ctx, admin, "node", "x\x1b[2J", time.Hour); errs.CodeOf(err) != errs.InvalidInput {
			t.Fatalf("token name with controls: %v, want INVALID_INPUT", err)
		}
	})
}

// nodes.list shows a revoked or quarantined node as such, with the reason,
// not as one more disconnected node.
func TestNodesListShowsRevokedAndQuarantined(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		clk := clock.NewFake(time.Now())
		e := testenv.Start(t, db, testenv.Options{Clock: clk})
		ctx := context.Background()
		ok := e.Join(t, pki.RoleNode, "ok")
		gone := e.Join(t, pki.RoleNode, "gone")
		cloned := e.Join(t, pki.RoleNode, "cloned")
		if _, err := e.CP.Nodes.Revoke(ctx, admin, gone.NodeID(), "", nodes.ReasonOperator); err != nil {
			t.Fatal(err)
		}
		if _, err := e.CP.Nodes.Revoke(ctx, admin, cloned.NodeID(), "", nodes.ReasonDuplicateIdentity); err != nil {
			t.Fatal(err)
		}
		want := map[string][2]string{
			ok.NodeID():     {nodes.StateActive, ""},
			gone.NodeID():   {nodes.StateRevoked, nodes.ReasonOperator},
			cloned.NodeID(): {nodes.StateQuarantined, nodes.ReasonDuplicateIdentity},
		}
		check := func() {
			t.Helper()
			ns, err := e.CP.Nodes.List(ctx, iam.RootScope())
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range ns {
				if w := want[n.ID]; n.State != w[0] || n.StateReason != w[1] {
					t.Errorf("%s: state %q (%q), want %q (%q)", n.Name, n.State, n.StateReason, w[0], w[1])
				}
			}
		}
		check()
		clk.Advance(25 * time.Hour) // every certificate expired
		want[ok.NodeID()] = [2]string{nodes.StateExpired, "certificate-expired"}
		check()
	})
}
