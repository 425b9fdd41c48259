package api

import (
	"context"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/iam"
)

// A caller string in a request's text is one line: only its first line,
// with control and format characters (a bidirectional override, an
// escape sequence, NUL) removed and invalid UTF-8 replaced, at most
// maxClip runes, a cut marked with "…".
func TestClipKeepsOneCleanLine(t *testing.T) {
	cases := []struct{ in, want string }{
		{"small", "small"},
		{"small\nlifetime: 1 s", "small…"},
		{"a\r\nb", "a…"},
		{"\x1b[31mred\x1b[0m", "[31mred[0m"},
		{"evil\u202egpj.exe", "evilgpj.exe"},
		{"nul\x00byte", "nulbyte"},
		{"bad\xffutf8", "bad\uFFFDutf8"},
		{strings.Repeat("x", maxClip+5), strings.Repeat("x", maxClip) + "…"},
	}
	for _, c := range cases {
		if got := clip(c.in); got != c.want {
			t.Errorf("clip(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// The text of a request is deterministic: the same input reads the same
// whatever the order of the caller's labels, nodes or map; a different
// payload, lifetime or node reads differently; a payload appears only by
// size and SHA-256; each caller string stays on its line.
func TestRequestTextIsDeterministic(t *testing.T) {
	ctx := context.Background()
	d := iam.Delegation{AgentID: "i_a", AgentName: "claude", PersonID: "i_p", PersonName: "alice"}
	fan := func(in apitypes.FanoutIn) string {
		t.Helper()
		txt, held, err := describeFanoutText(ctx, in)
		if err != nil || !held {
			t.Fatalf("fanout: %v %v", held, err)
		}
		return requestText(d, "commands.fanout", "t_1", txt)
	}
	a := apitypes.FanoutIn{NodeIDs: []string{"n2", "n1"}, Labels: map[string]string{"b": "2", "a": "1"}, Kind: "disk.wipe", Payload: []byte(`{"secret":"hunter2"}`), TTLSeconds: 60}
	b := apitypes.FanoutIn{NodeIDs: []string{"n1", "n2"}, Labels: map[string]string{"a": "1", "b": "2"}, Kind: "disk.wipe", Payload: []byte(`{"secret":"hunter2"}`), TTLSeconds: 60}
	if fan(a) != fan(b) {
		t.Fatalf("the same request reads two ways:\n%s\n%s", fan(a), fan(b))
	}
	if strings.Contains(fan(a), "hunter2") || !strings.Contains(fan(a), "payload: 20 bytes, sha256 ") {
		t.Fatalf("the payload is not described by size and digest:\n%s", fan(a))
	}
	for _, change := range []func(*apitypes.FanoutIn){
		func(x *apitypes.FanoutIn) { x.Payload = []byte(`{"secret":"hunter3"}`) },
		func(x *apitypes.FanoutIn) { x.TTLSeconds = 61 },
		func(x *apitypes.FanoutIn) { x.NodeIDs = []string{"n1", "n3"} },
		func(x *apitypes.FanoutIn) { x.Kind = "disk.wipe\nnode: n9" },
	} {
		c := b
		change(&c)
		if fan(c) == fan(b) {
			t.Errorf("a changed request reads the same: %+v", c)
		}
	}
	evil := b
	evil.Kind = "disk.wipe\nttl: 0 s"
	if got := fan(evil); strings.Count(got, "\nttl: ") != 1 {
		t.Fatalf("a caller string wrote a line of its own:\n%s", got)
	}
}

// describeFanoutText is describeFanout's text for a kind the tenant holds
// back (the hold-back read is the IAM module's, tested there).
func describeFanoutText(_ context.Context, in apitypes.FanoutIn) (string, bool, error) {
	return fanoutText(in), true, nil
}

// A batch of more leaves than the text lists still reads differently
// when any leaf differs: the leaves past the list are counted and digested.
func TestBatchTextCoversEveryLeaf(t *testing.T) {
	leaves := make([]apitypes.LeafIn, maxListed+3)
	for i := range leaves {
		leaves[i] = apitypes.LeafIn{NodeID: "n" + strings.Repeat("x", i%5), Kind: "node.reboot"}
	}
	text := func(ls []apitypes.LeafIn) string {
		s, _, _ := describeBatch(context.Background(), nil, nil, apitypes.BatchCreateIn{Leaves: ls, ExpiresSeconds: 3600})
		return s
	}
	changed := append([]apitypes.LeafIn{}, leaves...)
	changed[len(changed)-1].Payload = []byte(`{"x":1}`)
	if text(leaves) == text(changed) || !strings.Contains(text(leaves), "leaves not shown: and 3 more; all sha256 ") {
		t.Fatalf("a leaf past the list is not covered:\n%s", text(leaves))
	}
}

// FuzzRequestText: for any caller strings, the text is the same twice,
// valid UTF-8, has exactly the lines the describer writes (no caller
// string adds one) and holds no control character but the newlines.
func FuzzRequestText(f *testing.F) {
	f.Add("claude", "alice", "n1", "disk.wipe", []byte(`{"a":1}`), "team", "red")
	f.Add("a\nb", "\u202e", "n\x00", "k\r\nttl: 0 s", []byte{}, "\xff", "\x1b[0m")
	f.Fuzz(func(t *testing.T, agent, person, node, kind string, payload []byte, lk, lv string) {
		d := iam.Delegation{AgentID: "i_a", AgentName: agent, PersonID: "i_p", PersonName: person}
		in := apitypes.FanoutIn{NodeIDs: []string{node, kind}, Labels: map[string]string{lk: lv}, Kind: kind, Payload: payload}
		one := requestText(d, "commands.fanout", node, fanoutText(in))
		if two := requestText(d, "commands.fanout", node, fanoutText(in)); one != two {
			t.Fatal("the text is not deterministic")
		}
		if !utf8.ValidString(one) {
			t.Fatalf("invalid UTF-8: %q", one)
		}
		if n := strings.Count(one, "\n"); n != 8 {
			t.Fatalf("%d lines, want 8:\n%q", n, one)
		}
		for _, r := range one {
			if r != '\n' && (unicode.IsControl(r) || unicode.Is(unicode.Cf, r)) {
				t.Fatalf("control character %U in %q", r, one)
			}
		}
	})
}
