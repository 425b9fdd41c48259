// Package jsonstrict checks a caller's JSON before Go's decoder reads it,
// for what encoding/json lets through silently: bytes that are not UTF-8
// (decoded as U+FFFD), a key given twice in one object (the last one
// wins) and nesting deep enough to be a denial of service. The API's
// bodies and the MCP gate's tool arguments are checked by it, so both
// front doors refuse the same inputs with the same messages.
package jsonstrict

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"unicode/utf8"

	"github.com/bettercompute/bettercompute/internal/errs"
)

// MaxDepth is how deeply objects and arrays may nest.
const MaxDepth = 64

// Check refuses raw, named what in the message ("body", "arguments"),
// with INVALID_INPUT when it is not UTF-8, not well-formed JSON (a caller
// that wants exactly one value checks for trailing data itself),
// nests deeper than MaxDepth, or has an object with a key twice.
func Check(raw []byte, what string) error {
	if !utf8.Valid(raw) {
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
		default:
			if top != nil && top.obj {
				top.expect = true
			}
		}
	}
}
