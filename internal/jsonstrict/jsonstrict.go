// Package jsonstrict checks a caller's JSON before Go's decoder reads it,
// for what encoding/json lets through silently: bytes that are not UTF-8
// and escaped UTF-16 surrogates that are not a pair (both decoded as
// U+FFFD), a key given twice in one object (the last one
// wins), a NUL character in a string (which PostgreSQL cannot store in
// text, so it would fail there and pass on SQLite), a number too large
// for a float64 (which a decoder into any
// refuses only later, with Go's own words) and nesting deep enough to be
// a denial of service. The API's
// bodies and the MCP gate's tool arguments are checked by it, so both
// front doors refuse the same inputs with the same messages.
package jsonstrict

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/bettercompute/bettercompute/internal/errs"
)

// MaxDepth is how deeply objects and arrays may nest.
const MaxDepth = 64

// Check refuses raw, named what in the message ("body", "arguments"),
// with INVALID_INPUT when it is not UTF-8, not well-formed JSON (a caller
// that wants exactly one value checks for trailing data itself),
// nests deeper than MaxDepth, has an object with a key twice, has a NUL
// in a string or key, or has a number beyond float64's range.
func Check(raw []byte, what string) error {
	if !utf8.Valid(raw) || !surrogatesPaired(raw) {
		return errs.New(errs.InvalidInput, "the "+what+" is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	type frame struct {
		obj    bool
		keys   map[string]bool
		expect bool // the next string token in an object is a key
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err == io.EOF && len(stack) == 0 {
			return nil
		}
		if err != nil {
			return errs.New(errs.InvalidInput, "the "+what+" is not valid JSON")
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if str, ok := tok.(string); ok && strings.IndexByte(str, 0) >= 0 {
			return errs.New(errs.InvalidInput, "the "+what+" has a NUL character in a string")
		}
		if top != nil && top.obj && top.expect {
			if k, ok := tok.(string); ok {
				if top.keys[k] {
					return errs.New(errs.InvalidInput, fmt.Sprintf("duplicate key %q", k))
				}
				top.keys[k] = true
				top.expect = false
				continue
			}
		}
		switch d := tok.(type) {
		case json.Delim:
			switch d {
			case '{', '[':
				if len(stack) >= MaxDepth {
					return errs.New(errs.InvalidInput, "the "+what+" nests too deeply")
				}
				if top != nil && top.obj {
					top.expect = true
				}
				stack = append(stack, &frame{obj: d == '{', keys: map[string]bool{}, expect: d == '{'})
			case '}', ']':
				stack = stack[:len(stack)-1]
			}
		case json.Number:
			if _, err := strconv.ParseFloat(string(d), 64); err != nil {
				return errs.New(errs.InvalidInput, "the "+what+" has a number out of range")
			}
			if top != nil && top.obj {
				top.expect = true
			}
		default:
			if top != nil && top.obj {
				top.expect = true
			}
		}
	}
}

// surrogatesPaired reports whether every \uD800-\uDFFF escape in raw's
// strings is a high surrogate followed at once by an escaped low one:
// anything else is no character, and Go's decoder would turn it into
// U+FFFD unseen. raw is scanned as JSON text: an escape only counts
// inside a string.
func surrogatesPaired(raw []byte) bool {
	in := false
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch {
		case !in:
			in = c == '"'
		case c == '"':
			in = false
		case c == '\\' && i+1 < len(raw):
			if raw[i+1] != 'u' {
				i++ // a two-character escape
				continue
			}
			r, ok := hex4(raw, i+2)
			switch {
			case !ok:
				return true // malformed: the decoder refuses it
			case r >= 0xDC00 && r <= 0xDFFF:
				return false // a low surrogate alone
			case r >= 0xD800 && r <= 0xDBFF:
				lo, ok := uint16(0), false
				if i+11 < len(raw) && raw[i+6] == '\\' && raw[i+7] == 'u' {
					lo, ok = hex4(raw, i+8)
				}
				if !ok || lo < 0xDC00 || lo > 0xDFFF {
					return false // a high surrogate without its low one
				}
				i += 11
			default:
				i += 5
			}
		}
	}
	return true
}

// hex4 reads the four hex digits at raw[at:].
func hex4(raw []byte, at int) (uint16, bool) {
	if at+4 > len(raw) {
		return 0, false
	}
	var r uint16
	for _, c := range raw[at : at+4] {
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | uint16(d)
	}
	return r, true
}
