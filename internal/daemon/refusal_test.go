package daemon

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// forgeries are messages carrying the id c1 that nobody signed for c1:
// each is refused with its reason before anything is journaled or signed.
func forgeries(f fixture) []struct {
	name, reason string
	msg          func() *nodev1.SignedCommand
} {
	return []struct {
		name, reason string
		msg          func() *nodev1.SignedCommand
	}{
		{"unsigned", ReasonSignatureMissing, func() *nodev1.SignedCommand {
			c := command(f, "c1", kinds.DiagRun, []byte("{}"))
			c.Signature, c.SignerCertDer = nil, nil
			return c
		}},
		{"garbage body", ReasonBodyMalformed, func() *nodev1.SignedCommand {
			c := command(f, "c1", kinds.DiagRun, []byte("{}"))
			c.Body = []byte{0xff, 0xff}
			return c
		}},
		{"bad signature", ReasonSignatureInvalid, func() *nodev1.SignedCommand {
			c := command(f, "c1", kinds.DiagRun, []byte("{}"))
			c.Signature[0] ^= 1
			return c
		}},
		{"untrusted signer", ReasonSignerUntrusted, func() *nodev1.SignedCommand {
			c := command(f, "c1", kinds.DiagRun, []byte("{}"))
			c.SignerCertDer = []byte{1, 2, 3}
			return c
		}},
		// A real command for another id, relabelled: its signature holds,
		// but nobody signed it for c1.
		{"another command's body", ReasonIDMismatch, func() *nodev1.SignedCommand {
			c := command(f, "c-other", kinds.DiagRun, []byte("{}"))
			c.Id = "c1"
			return c
		}},
	}
}

// forgery returns the forged message called name, made on f.
func forgery(f fixture, name string) *nodev1.SignedCommand {
	for _, x := range forgeries(f) {
		if x.name == name {
			return x.msg()
		}
	}
	return nil
}

// TestUnauthenticatedRefusalLeavesNoTrace replays issue 14 item 5: a
// message whose signature does not verify for its id is logged and
// counted, never journaled and never answered with a signed update. An
// unsigned copy arriving before the real command does not make the real
// one a replay, and one arriving after the real command succeeded does not
// make the node sign a second, contradictory result.
func TestUnauthenticatedRefusalLeavesNoTrace(t *testing.T) {
	for _, fg := range forgeries(newFixture(t)) {
		t.Run(fg.name+"/before the real command", func(t *testing.T) {
			f := newFixture(t)
			n, sim, key := openTestNode(t, f, -1)
			msg := forgery(f, fg.name)
			e := startExecutor(t, n, key, noSecrets)
			e.work <- msg
			e.work <- command(f, "c1", kinds.DiagRun, []byte("{}"))
			// Commands are handled in order: the first update is the real
			// command's, so the forgery produced none.
			wantUpdate(t, e.next(), "c1", "running", "")
			wantUpdate(t, e.next(), "c1", "succeeded", "")
			e.finish()
			if sim.Runs(kinds.DiagRun) != 1 {
				t.Fatalf("diag.run ran %d times, want 1", sim.Runs(kinds.DiagRun))
			}
			if r := n.Refusals(); r[fg.reason] != 1 || r[ReasonReplayed] != 0 || len(r) != 1 {
				t.Fatalf("refusals %v, want one %q", r, fg.reason)
			}
		})
		t.Run(fg.name+"/after the real command succeeded", func(t *testing.T) {
			f := newFixture(t)
			n, sim, key := openTestNode(t, f, -1)
			msg := forgery(f, fg.name)
			e := startExecutor(t, n, key, noSecrets)
			e.work <- command(f, "c1", kinds.DiagRun, []byte("{}"))
			wantUpdate(t, e.next(), "c1", "running", "")
			wantUpdate(t, e.next(), "c1", "succeeded", "")
			e.work <- msg
			// A later real command: its update proves the forgery was
			// handled, and that it sent nothing.
			e.work <- command(f, "c2", kinds.DiagRun, []byte("{}"))
			wantUpdate(t, e.next(), "c2", "running", "")
			wantUpdate(t, e.next(), "c2", "succeeded", "")
			e.finish()
			if sim.Runs(kinds.DiagRun) != 2 {
				t.Fatalf("diag.run ran %d times, want 2", sim.Runs(kinds.DiagRun))
			}
			raw, ok := n.journal.Final("c1")
			if !ok {
				t.Fatal("c1 has no journaled result")
			}
			var u nodev1.CommandUpdate
			var b nodev1.UpdateBody
			if err := proto.Unmarshal(raw, &u); err != nil || proto.Unmarshal(u.Body, &b) != nil || b.State != "succeeded" {
				t.Fatalf("c1's journaled result is %s (%v), want succeeded", b.State, err)
			}
			if r := n.Refusals(); r[fg.reason] != 1 || len(r) != 1 {
				t.Fatalf("refusals %v, want one %q", r, fg.reason)
			}
		})
	}
}
