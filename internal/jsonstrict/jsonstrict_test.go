package jsonstrict

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/bettercompute/bettercompute/internal/errs"
)

// TestCheck: what Go's decoder lets through silently is refused with its
// own message; everything else passes.
func TestCheck(t *testing.T) {
	deep := strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1)
	for raw, want := range map[string]string{
		"{\"a\":\"\xff\"}":                  "the body is not valid UTF-8",
		"{\"\xc3\":1}":                      "the body is not valid UTF-8",
		`{"a":"x\ud800y"}`:                  "the body is not valid UTF-8",
		`{"a":"x\udc00"}`:                   "the body is not valid UTF-8",
		`{"a":"\ud800\u0041"}`:              "the body is not valid UTF-8",
		`{"\uDBFF":1}`:                      "the body is not valid UTF-8",
		`{"a":1,"a":2}`:                     `duplicate key "a"`,
		`{"x":{"a":1,"b":[{"a":1,"a":2}]}}`: `duplicate key "a"`,
		`{"a":`:                             "the body is not valid JSON",
		deep:                                "the body nests too deeply",
		`{"a":9E00000000400}`:               "the body has a number out of range",
		`[-1e309]`:                          "the body has a number out of range",
		`{"id":"n\u0000"}`:                  "the body has a NUL character in a string",
		`{"a":{"\u0000":1}}`:                "the body has a NUL character in a string",
	} {
		err := Check([]byte(raw), "body")
		if errs.CodeOf(err) != errs.InvalidInput || errs.SafeMessage(err) != want {
			t.Errorf("%q: %v, want INVALID_INPUT %s", raw, err, want)
		}
	}
	ok := strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth)
	for _, raw := range []string{`{}`, `{"a":1,"b":{"a":2},"c":[{"a":1},{"a":2}]}`, `{"é":"\u00e9"}`, ok,
		`{"a":"\ud83d\ude00 \\ud800"}`, `{"a":"\\\ud83d\ude00"}`, `{"a":"\"\ud83d\ude00"}`, `[1e308,-1e308,1e-400,0.5]`} {
		if err := Check([]byte(raw), "body"); err != nil {
			t.Errorf("%q refused: %v", raw, err)
		}
	}
}

// FuzzCheck: whatever Check accepts is UTF-8 and JSON that Go decodes, and
// decodes to U+FFFD only where the input spelled it.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1,"a":2}`, "{\"a\":\"\xff\"}", `[[[]]]`, `{"a":{"b":[1,2,{"c":null}]}}`, `1 2`,
		`{"a":"\ud800"}`, `{"a":"\ud83d\ude00"}`, `{"a":"\\ud800"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if Check(raw, "body") != nil {
			return
		}
		if !utf8.Valid(raw) {
			t.Fatalf("accepted %q, not UTF-8", raw)
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		for {
			var v any
			err := dec.Decode(&v)
			if err == io.EOF {
				return
			}
			if err != nil {
				t.Fatalf("accepted %q, which Go does not decode: %v", raw, err)
			}
			enc, _ := json.Marshal(v)
			spelled := bytes.Contains(raw, []byte("\uFFFD")) || bytes.Contains(bytes.ToLower(raw), []byte(`\ufffd`))
			if bytes.Contains(enc, []byte("\uFFFD")) && !spelled {
				t.Fatalf("accepted %q, which decodes to U+FFFD", raw)
			}
		}
	})
}
