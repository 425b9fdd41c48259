package integration

import (
	"context"
	"crypto/sha256"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/daemon/journal"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
	"github.com/bettercompute/bettercompute/internal/testenv/tmpfs"
)

// TestNodeDataDirFaults runs a real bcd whose data folder is a real tmpfs
// the test fills (ENOSPC) or remounts read-only (EROFS). Before the fault
// the node journaled a result it could not send yet; the node is then
// started on the faulty folder (its journal cannot be compacted). The
// journaled result reaches the control plane (succeeded, attested) and
// the session survives the ack the journal cannot write; a new command is
// refused with the reason naming the fault (data-dir-full: less free than
// daemon.DefaultMinFreeBytes; data-dir-read-only: the journal's start
// entry failed with EROFS), shown by commands.get, and never runs; a
// folder not full but with less free than the node's reserve refuses the
// same way (data-dir-full). Once
// the space or the write access returns, the next command runs on the
// same session, with no restart, and the refusal made during the fault
// is in the journal file.
func TestNodeDataDirFaults(t *testing.T) {
	faults := []struct {
		name         string
		reason       string
		break_, heal func(t testing.TB, dir string)
	}{
		{"full", daemon.ReasonDataDirFull,
			func(t testing.TB, dir string) { tmpfs.Fill(t, dir) },
			func(t testing.TB, dir string) {
				if err := os.Remove(filepath.Join(dir, "filler")); err != nil {
					t.Fatal(err)
				}
			}},
		{"read-only", daemon.ReasonDataDirReadOnly, tmpfs.ReadOnly, tmpfs.ReadWrite},
		// Not full, but less free than the node keeps for the results,
		// acks and refusals of commands it already took: the refusal is
		// journaled at once.
		{"below-reserve", daemon.ReasonDataDirFull,
			func(t testing.TB, dir string) {
				filler := tmpfs.Fill(t, dir)
				st, err := os.Stat(filler)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.Truncate(filler, st.Size()-daemon.DefaultMinFreeBytes/2); err != nil {
					t.Fatal(err)
				}
			},
			func(t testing.TB, dir string) {
				if err := os.Remove(filepath.Join(dir, "filler")); err != nil {
					t.Fatal(err)
				}
			}},
	}
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		for _, f := range faults {
			t.Run(f.name, func(t *testing.T) {
				ctx := context.Background()
				e := testenv.Start(t, db, testenv.Options{})
				dir := tmpfs.Mount(t, 16<<20)
				n := e.JoinIn(t, dir, pki.RoleNode, "")
				n.Start(t)
				n.WaitConnected(t)
				create := func() commands.Command {
					t.Helper()
					c, err := e.CP.Commands.Create(ctx, admin, n.NodeID(), "diag.run", nil, time.Hour)
					if err != nil {
						t.Fatal(err)
					}
					return c
				}
				if c := e.WaitCommand(t, create().ID); c.State != "succeeded" {
					t.Fatalf("before the fault: %s %s", c.State, c.Reason)
				}

				// The node ran a command and journaled its result, which did
				// not reach the control plane before the fault.
				n.Stop()
				pending := create()
				if _, err := db.ExecContext(ctx, `UPDATE commands SET state = 'sent' WHERE id = $1`, pending.ID); err != nil {
					t.Fatal(err)
				}
				j, err := journal.Open(filepath.Join(dir, "journal.log"), time.Now(), time.Hour)
				if err != nil {
					t.Fatal(err)
				}
				upd, err := n.SignUpdate(boundDiagRunUpdate(pending.ID, "succeeded", `{"ran":true}`))
				if err != nil {
					t.Fatal(err)
				}
				sum := sha256.Sum256([]byte("{}"))
				if fresh, err := j.Begin(pending.ID, time.Now().Add(time.Hour), "diag.run", sum[:]); !fresh || err != nil {
					t.Fatal(fresh, err)
				}
				if err := j.Done(pending.ID, time.Now().Add(time.Hour), upd); err != nil {
					t.Fatal(err)
				}

				f.break_(t, dir)
				n2 := e.OpenNode(t, dir, "")
				n2.Start(t)
				n2.WaitConnected(t)
				session := func() string {
					t.Helper()
					var id string
					if err := db.QueryRowContext(ctx, `SELECT session_id FROM node_sessions WHERE node_id = $1`, n2.NodeID()).Scan(&id); err != nil {
						t.Fatal(err)
					}
					return id
				}
				first := session()

				got := e.WaitCommand(t, pending.ID)
				if got.State != "succeeded" || !got.Attested || compactJSON(t, got.Result) != `{"ran":true}` {
					t.Fatalf("result journaled before the fault: %s attested=%v %s, want succeeded, attested, its result", got.State, got.Attested, got.Result)
				}

				refused := create()
				expectCancelled(t, e, n2, refused.ID, "diag.run", f.reason)
				shown, err := e.Client.Command(ctx, refused.ID)
				if err != nil || shown.State != "cancelled" || shown.Reason != f.reason || !shown.Attested {
					t.Fatalf("commands.get: %+v %v, want cancelled %q, attested", shown, err, f.reason)
				}

				f.heal(t, dir)
				if c := e.WaitCommand(t, create().ID); c.State != "succeeded" {
					t.Fatalf("after the fault: %s %s, want succeeded", c.State, c.Reason)
				}
				if runs := n2.Sim.Runs("diag.run"); runs != 1 {
					t.Fatalf("diag.run ran %d times after the restart, want 1 (the command after the fault)", runs)
				}
				if s := session(); s != first {
					t.Fatalf("session %s replaced by %s: the fault ended a session", first, s)
				}
				n2.Stop()
				j2, err := journal.Open(filepath.Join(dir, "journal.log"), time.Now(), time.Hour)
				if err != nil {
					t.Fatal(err)
				}
				if _, ok := j2.Final(refused.ID); !ok {
					t.Fatal("the refusal made during the fault is not in the journal file")
				}
			})
		}
	})
}
