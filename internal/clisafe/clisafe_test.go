package clisafe

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// hostile is a node name as an attacker would choose it: an OSC title
// change, a screen clear, a raw C1 CSI and DEL.
const hostile = "box\x1b]0;pwned\a\x1b[2J\u009b31m\x7fend"

func TestCleanStripsTerminalControls(t *testing.T) {
	for in, want := range map[string]string{
		hostile:             "box]0;pwned[2J31mend",
		"plain text\tok\n":  "plain text\tok\n",
		"née ✓":             "née ✓",
		"a\u0085b\u009fc":   "abc",
		"bad\xc2utf8\xff!":  "badutf8!",
		"\r\x00\x08\x1b[0m": "[0m",
	} {
		if got := Clean(in); got != want {
			t.Errorf("Clean(%q) = %q, want %q", in, got, want)
		}
	}
}

// A C1 rune split across two writes is still recognised and dropped.
func TestWriterJudgesRunesWhole(t *testing.T) {
	var out bytes.Buffer
	w := &Writer{W: &out}
	in := []byte("a\u009bb\u00e9c")
	for i := range in {
		if n, err := w.Write(in[i : i+1]); n != 1 || err != nil {
			t.Fatalf("write: %d %v", n, err)
		}
	}
	if out.String() != "ab\u00e9c" {
		t.Fatalf("got %q", out.String())
	}
	if Raw(w) != &out {
		t.Fatal("Raw does not return the underlying writer")
	}
}

func TestEscapeJSON(t *testing.T) {
	js, err := json.Marshal(map[string]string{"name": hostile + "\u0080\u0085"})
	if err != nil {
		t.Fatal(err)
	}
	esc := EscapeJSON(js)
	if bytes.ContainsFunc(esc, func(r rune) bool { return r < 0x20 || r == 0x7f || r >= 0x80 && r <= 0x9f }) {
		t.Fatalf("control left in %q", esc)
	}
	var back map[string]string
	if err := json.Unmarshal(esc, &back); err != nil || back["name"] != hostile+"\u0080\u0085" {
		t.Fatalf("meaning changed: %v %q", err, back["name"])
	}
}

// Whatever the bytes and however they are split into writes, the Writer
// prints exactly Clean of the whole, and nothing a terminal acts on.
func FuzzWriter(f *testing.F) {
	f.Add([]byte(hostile), 3)
	f.Add([]byte("\xe2\x9c\x93 ok"), 1)
	f.Add([]byte("\xc2\x9b\xc2"), 2)
	f.Fuzz(func(t *testing.T, in []byte, step int) {
		if step <= 0 || step > len(in)+1 {
			step = len(in) + 1
		}
		var out bytes.Buffer
		w := &Writer{W: &out}
		for i := 0; i < len(in); i += step {
			if _, err := w.Write(in[i:min(i+step, len(in))]); err != nil {
				t.Fatal(err)
			}
		}
		got := out.String()
		if want := Clean(string(in)); got != want {
			t.Fatalf("split %d: got %q, want %q", step, got, want)
		}
		if !utf8.ValidString(got) || strings.IndexFunc(got, unsafeRune) >= 0 {
			t.Fatalf("unsafe output %q", got)
		}
	})
}
