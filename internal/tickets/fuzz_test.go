package tickets_test

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/tickets"
)

// updateSeeds rewrites the committed fuzz corpus from the fixture:
// go test ./internal/tickets -run TestFuzzSeeds -update-seeds
var updateSeeds = flag.Bool("update-seeds", false, "rewrite testdata/fuzz/FuzzTicket from the fixture")

// seedDir holds FuzzTicket's committed corpus.
var seedDir = filepath.Join("testdata", "fuzz", "FuzzTicket")

// seeds are the corpus: the genuine ticket, genuinely signed tickets that
// must be refused (another node, expired, signed under the time context),
// and garbage. Every signature is by the fixture's deterministic worker
// key, so a committed seed means the same on every run.
func seeds(tb testing.TB, f *fixture) map[string][]byte {
	wrongNode := body()
	wrongNode.NodeId = nodeB
	expired := body()
	expired.IssuedAtMs, expired.ExpiresAtMs = t0.Add(-time.Minute).UnixMilli(), t0.UnixMilli()
	return map[string][]byte{
		"genuine":    f.raw(tb, body()),
		"wrong-node": f.raw(tb, wrongNode),
		"expired":    f.raw(tb, expired),
		"time-sig":   marshal(tb, f.signRaw(marshal(tb, body()), wire.TimeSigContext)),
		"garbage":    []byte("\x0a\x05hello\x12\xff\x01garbage"),
	}
}

// TestFuzzSeeds checks that the committed corpus means what its names
// say (the genuine seed is accepted, the others refused by their own
// reasons), and rewrites it with -update-seeds.
func TestFuzzSeeds(t *testing.T) {
	f := newFixture(t)
	if *updateSeeds {
		if err := os.MkdirAll(seedDir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, raw := range seeds(t, f) {
			if err := os.WriteFile(filepath.Join(seedDir, name), fmt.Appendf(nil, "go test fuzz v1\n[]byte(%q)\n", raw), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for name, r := range map[string]tickets.Reason{"genuine": "", "wrong-node": tickets.ReasonWrongNode, "expired": tickets.ReasonExpired,
		"time-sig": tickets.ReasonSignatureInvalid, "garbage": tickets.ReasonMalformed} {
		file, err := os.ReadFile(filepath.Join(seedDir, name))
		if err != nil {
			t.Fatal(err)
		}
		var raw []byte
		if _, err := fmt.Sscanf(string(bytes.TrimPrefix(file, []byte("go test fuzz v1\n"))), "[]byte(%q)", &raw); err != nil {
			t.Fatalf("seed %s: %v", name, err)
		}
		if _, got := f.verifier().Verify(raw, t0, want()); got != r {
			t.Fatalf("seed %s: %q, want %q", name, got, r)
		}
	}
}

// reasons is every reason Verify may give.
var reasons = map[tickets.Reason]bool{"": true, tickets.ReasonOversized: true, tickets.ReasonMalformed: true, tickets.ReasonSignerUntrusted: true,
	tickets.ReasonSignatureInvalid: true, tickets.ReasonLifetimeTooLong: true, tickets.ReasonNotYetValid: true, tickets.ReasonExpired: true,
	tickets.ReasonWrongNode: true, tickets.ReasonWrongPort: true, tickets.ReasonWrongSandbox: true, tickets.ReasonUnexpectedAction: true}

// FuzzTicket feeds arbitrary bytes to Verify as a node would receive
// them. Property: nothing panics; every answer is a known reason; a
// refusal returns no body; and the only ticket ever accepted is one whose
// body is byte for byte the genuine body the fixture signed (the fuzzer
// holds no key, so it can at most re-wrap that ticket), returned as
// signed. Verify and VerifySigned agree on an acceptance.
func FuzzTicket(f *testing.F) {
	fx := newFixture(f)
	for _, raw := range seeds(f, fx) {
		f.Add(raw)
	}
	genuine := marshal(f, body())
	v := fx.verifier()
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, r := v.Verify(raw, t0, want())
		if !reasons[r] {
			t.Fatalf("unknown reason %q", r)
		}
		if r != "" {
			if got != nil {
				t.Fatalf("refused (%q) with a body", r)
			}
			return
		}
		var st nodev1.SignedTicket
		if err := proto.Unmarshal(raw, &st); err != nil {
			t.Fatalf("accepted bytes that do not parse: %v", err)
		}
		if !bytes.Equal(st.Body, genuine) || !proto.Equal(got, body()) {
			t.Fatalf("accepted a body that is not the genuine one: %v", got)
		}
		if _, r2 := v.VerifySigned(&st, t0, want()); r2 != "" {
			t.Fatalf("Verify accepted what VerifySigned refuses (%q)", r2)
		}
	})
}
