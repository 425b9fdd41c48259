package bcdcli_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/bcdcli"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

var operator = audit.Entry{TenantID: iam.RootTenant, Actor: "test"}

// A node whose certificate is revoked while its session is up stops: Run
// returns a RevokedError (errors.Is ErrRevoked) naming the node and bcd
// join, instead of reconnecting forever.
func TestRevokedNodeStopsReconnecting(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{})
		n := e.Join(t, pki.RoleNode, "to-revoke")
		defer n.Close()
		ran := make(chan error, 1)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() { ran <- n.Run(ctx) }()
		n.WaitConnected(t)
		if _, err := e.CP.Nodes.Revoke(ctx, operator, n.NodeID(), "", nodes.ReasonOperator); err != nil {
			t.Fatal(err)
		}
		err := <-ran // Run returns by itself: the test never cancels ctx first
		var re *daemon.RevokedError
		if !errors.Is(err, daemon.ErrRevoked) || !errors.As(err, &re) || re.NodeID != n.NodeID() {
			t.Fatalf("Run after revocation: %v, want a RevokedError for %s", err, n.NodeID())
		}
		if msg := err.Error(); !strings.Contains(msg, "revoked") || !strings.Contains(msg, "bcd join") || !strings.Contains(msg, "join-tokens create") {
			t.Fatalf("message does not say how to re-join: %s", msg)
		}
	})
}

// bcd node on a revoked node's data directory exits 1 at once with the
// re-join instructions, after one ERROR line (no reconnect loop).
func TestBcdNodeRevokedExits(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	n := e.Join(t, pki.RoleNode, "gone")
	id := n.NodeID()
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.CP.Nodes.Revoke(context.Background(), operator, id, "", nodes.ReasonOperator); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := bcdcli.Main([]string{"node", "--data", n.Dir, "--driver", "sim", "--sandbox-runtime", "none", "--gateway", e.CP.GatewayAddr}, strings.NewReader(""), &out, &errb)
	if code != 1 {
		t.Fatalf("exit %d, want 1: %s", code, errb.String())
	}
	s := errb.String()
	if !strings.Contains(s, "error: node "+id+": the control plane revoked") || !strings.Contains(s, "bcd join --gateway "+e.CP.GatewayAddr+" --data "+n.Dir) {
		t.Fatalf("stderr does not say how to re-join:\n%s", s)
	}
	if strings.Count(s, "level=ERROR") != 1 || strings.Contains(s, "session ended") {
		t.Fatalf("want one ERROR line and no reconnect:\n%s", s)
	}
}
