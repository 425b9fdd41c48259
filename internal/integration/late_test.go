package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/daemon/journal"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// TestLateAttestedResultIsRecorded: a node's result that reaches the
// control plane after the sweep cancelled its command as expired is
// recorded when it is attested: the command shows what the node did
// (succeeded, its result, attested) and late=true (commands.get), not
// "cancelled, expired" as if it never ran. The result travels the real
// path: journaled by bcd while it could not reach the gateway and sent on
// its next session. Only an expired-cancelled command takes it: an
// operator-cancelled one and a result whose signature does not verify
// leave the command cancelled, and a second result for the command is
// ignored. The last command journaled is live, so its result being
// recorded means every earlier one was handled.
func TestLateAttestedResultIsRecorded(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		ctx := context.Background()
		n := e.Nodes[0]
		n.Stop()
		create := func() commands.Command {
			c, err := e.CP.Commands.Create(ctx, admin, n.NodeID(), "diag.run", nil, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
		late, forged, byOperator, live := create(), create(), create(), create()
		if _, err := e.CP.Commands.Cancel(ctx, admin, iam.RootScope(), byOperator.ID); err != nil {
			t.Fatal(err)
		}
		// late and forged were delivered, then expired more than a minute
		// ago with no result: the sweep cancels them (expired).
		past := time.Now().Add(-2 * commands.SentGrace).UnixMilli()
		for _, id := range []string{late.ID, forged.ID, live.ID} {
			if _, err := db.ExecContext(ctx, `UPDATE commands SET state = 'sent' WHERE id = $1`, id); err != nil {
				t.Fatal(err)
			}
		}
		for _, id := range []string{late.ID, forged.ID} {
			if _, err := db.ExecContext(ctx, `UPDATE commands SET expires_at = $1 WHERE id = $2`, past, id); err != nil {
				t.Fatal(err)
			}
		}
		if swept, err := e.CP.Commands.SweepExpired(ctx); err != nil || swept != 2 {
			t.Fatalf("sweep: %d %v, want 2", swept, err)
		}

		// The node ran all four while it could not reach the gateway.
		j, err := journal.Open(filepath.Join(n.Dir, "journal.log"), time.Now(), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		emptySum := sha256.Sum256([]byte("{}"))
		for _, c := range []commands.Command{late, forged, byOperator, live} {
			upd, err := n.SignUpdate(boundDiagRunUpdate(c.ID, "succeeded", `{"ran":true}`))
			if err != nil {
				t.Fatal(err)
			}
			if c.ID == forged.ID {
				upd = flipSignature(t, upd)
			}
			if err := j.StartCommand(c.ID, time.Now().Add(time.Hour), "diag.run", emptySum[:]); err != nil {
				t.Fatal(err)
			}
			if err := j.Done(c.ID, time.Now().Add(time.Hour), upd); err != nil {
				t.Fatal(err)
			}
		}
		j.Close()
		n2 := e.OpenNode(t, n.Dir, "")
		n2.Start(t)
		if got := e.WaitCommand(t, live.ID); got.State != "succeeded" || got.Late {
			t.Fatalf("live: %s late=%v, want succeeded, not late", got.State, got.Late)
		}

		got, err := e.Client.Command(ctx, late.ID)
		if err != nil || got.State != "succeeded" || !got.Attested || !got.Late || compactJSON(t, got.Result) != `{"ran":true}` {
			t.Fatalf("late: %+v %v, want succeeded, attested, late, its result", got, err)
		}
		for id, reason := range map[string]string{forged.ID: commands.ReasonExpired, byOperator.ID: commands.ReasonOperatorCancelled} {
			got, err := e.Client.Command(ctx, id)
			if err != nil || got.State != "cancelled" || got.Reason != reason || got.Late || got.Attested {
				t.Errorf("%s: %s %q late=%v attested=%v (%v), want cancelled %q, not late", id, got.State, got.Reason, got.Late, got.Attested, err, reason)
			}
		}

		// A second result for the late command changes nothing.
		again, err := n2.SignUpdate(boundDiagRunUpdate(late.ID, "failed", `{"again":true}`))
		if err != nil {
			t.Fatal(err)
		}
		res := e.CP.Commands.ApplyUpdates(ctx, []commands.UpdateItem{{NodeID: n2.NodeID(), Update: unmarshalUpdate(t, again)}})
		if res[0].Err != nil || res[0].State != "succeeded" {
			t.Fatalf("second result: %+v, want acknowledged as succeeded", res[0])
		}
		if got, _ := e.Client.Command(ctx, late.ID); got.State != "succeeded" || compactJSON(t, got.Result) != `{"ran":true}` || !got.Late {
			t.Fatalf("after a second result: %+v, want the first kept", got)
		}
	})
}

// flipSignature returns the marshalled update raw with one bit of its
// node signature flipped.
func flipSignature(t *testing.T, raw []byte) []byte {
	t.Helper()
	u := unmarshalUpdate(t, raw)
	u.NodeSig[len(u.NodeSig)-1] ^= 1
	out, err := proto.Marshal(u)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// compactJSON is b without insignificant space.
func compactJSON(t *testing.T, b []byte) string {
	t.Helper()
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// TestRefusedUpdateIsAnsweredRefused: the gateway answers every update,
// a refused one too: an update the database did not record (here a
// trigger makes it fail, as a database that stays down would) is answered
// refused INTERNAL_ERROR with no state, one naming an unknown command
// refused NOT_FOUND, so the node knows it must send them again (or that
// no send will help); sent again once the database works, the result is
// acknowledged with its final state.
func TestRefusedUpdateIsAnsweredRefused(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{Nodes: 1})
		ctx := context.Background()
		n := e.Nodes[0]
		c, err := e.CP.Commands.Create(ctx, admin, n.NodeID(), "diag.run", nil, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		e.WaitCommand(t, c.ID)
		if _, err := db.ExecContext(ctx, `UPDATE commands SET state = 'sent', update_body = NULL WHERE id = $1`, c.ID); err != nil {
			t.Fatal(err)
		}
		s := openReportSession(t, n)
		refuse, allow := `CREATE TRIGGER refuse_updates BEFORE UPDATE ON commands BEGIN SELECT RAISE(ABORT, 'refused by test'); END`, `DROP TRIGGER refuse_updates`
		if db.Dialect == store.Postgres {
			if _, err := db.ExecContext(ctx, `CREATE FUNCTION refuse_updates() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused by test'; END $$`); err != nil {
				t.Fatal(err)
			}
			refuse, allow = `CREATE TRIGGER refuse_updates BEFORE UPDATE ON commands FOR EACH ROW EXECUTE FUNCTION refuse_updates()`, `DROP TRIGGER refuse_updates ON commands`
		}
		if _, err := db.ExecContext(ctx, refuse); err != nil {
			t.Fatal(err)
		}
		result := signedUpdate(t, n, c.ID, "succeeded")
		if got := s.sendUpdate(result); got.GetRefused() != string(errs.Internal) || got.GetState() != "" || got.GetCommandId() != c.ID {
			t.Fatalf("update the database refused: ack %v, want refused %s, no state", got, errs.Internal)
		}
		if got := s.sendUpdate(signedUpdate(t, n, "c-unknown", "succeeded")); got.GetRefused() != string(errs.NotFound) || got.GetState() != "" {
			t.Fatalf("update of an unknown command: ack %v, want refused %s", got, errs.NotFound)
		}
		if _, err := db.ExecContext(ctx, allow); err != nil {
			t.Fatal(err)
		}
		if got := s.sendUpdate(result); got.GetRefused() != "" || got.GetState() != "succeeded" {
			t.Fatalf("update sent again: ack %v, want succeeded", got)
		}
	})
}

// signedUpdate is n's signed update of command id to state.
func signedUpdate(t *testing.T, n *testenv.Node, id, state string) *nodev1.CommandUpdate {
	t.Helper()
	raw, err := n.SignUpdate(boundDiagRunUpdate(id, state, `{"ok":true}`))
	if err != nil {
		t.Fatal(err)
	}
	return unmarshalUpdate(t, raw)
}

// sendUpdate sends u then a ping and returns u's answer: the gateway
// answers a session's messages in order, so it comes before the ping's.
func (s *reportSession) sendUpdate(u *nodev1.CommandUpdate) *nodev1.UpdateAck {
	s.t.Helper()
	if err := s.stream.Send(&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Update{Update: u}}); err != nil {
		s.t.Fatal(err)
	}
	if err := s.stream.Send(&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Ping{Ping: &nodev1.Ping{}}}); err != nil {
		s.t.Fatal(err)
	}
	var ack *nodev1.UpdateAck
	for {
		m, err := s.stream.Recv()
		if err != nil {
			s.t.Fatalf("session: %v", err)
		}
		switch msg := m.Msg.(type) {
		case *nodev1.ServerMessage_Ack:
			ack = msg.Ack
		case *nodev1.ServerMessage_Ping:
			return ack
		}
	}
}
