// Package jsontime gives every timestamp the API and the CLI print one
// format: RFC 3339 in UTC with exactly three fractional digits
// ("2026-12-01T18:12:42.120Z"). encoding/json writes a time.Time with as
// many fractional digits as it has, none when they are zero, and in the
// time's own zone; Normalize rewrites such values in indented JSON.
package jsontime

import (
	"bytes"
	"time"
)

// Layout is the one timestamp format of API answers and CLI output.
const Layout = "2006-01-02T15:04:05.000Z07:00"

// Format renders t in Layout, in UTC.
func Format(t time.Time) string { return t.UTC().Format(Layout) }

// marker ends a timestamp member's key and opens its value: by convention
// every timestamp member is named *_at.
var marker = []byte(`_at": "`)

// Normalize rewrites, in JSON indented as json.MarshalIndent writes it,
// the value of every member whose key ends in "_at" and that is a valid
// RFC 3339 time, to Layout in UTC. Only a key that begins its line is
// considered: a string value cannot contain a raw newline, so text inside
// a value (which could spell `"x_at": "…"` only with escaped quotes
// anyway) is never taken for a key. Other values are left as they are.
// b is returned unchanged when nothing changes.
func Normalize(b []byte) []byte {
	var out []byte
	last, pos := 0, 0
	for {
		i := bytes.Index(b[pos:], marker)
		if i < 0 {
			break
		}
		i += pos
		pos = i + len(marker)
		if !keyBeginsLine(b, i) {
			continue
		}
		end := bytes.IndexAny(b[pos:], "\"\\\n")
		if end < 0 || b[pos+end] != '"' {
			continue
		}
		val := b[pos : pos+end]
		t, err := time.Parse(time.RFC3339Nano, string(val))
		if err != nil {
			continue
		}
		norm := Format(t)
		if norm == string(val) {
			continue
		}
		out = append(append(out, b[last:pos]...), norm...)
		last = pos + end
		pos = last
	}
	if out == nil {
		return b
	}
	return append(out, b[last:]...)
}

// keyBeginsLine reports whether the key ending at b[i] ("_at" at i) is a
// quoted run of [a-z0-9_] preceded on its line only by spaces or tabs.
func keyBeginsLine(b []byte, i int) bool {
	j := i - 1
	for j >= 0 && (b[j] >= 'a' && b[j] <= 'z' || b[j] >= '0' && b[j] <= '9' || b[j] == '_') {
		j--
	}
	if j < 0 || b[j] != '"' {
		return false
	}
	for j--; j >= 0 && b[j] != '\n'; j-- {
		if b[j] != ' ' && b[j] != '\t' {
			return false
		}
	}
	return true
}
