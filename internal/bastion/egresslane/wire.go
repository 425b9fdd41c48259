package egresslane

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"unicode/utf8"
)

// MaxLine is the longest line either side sends or accepts, newline
// included. A job's target fits in 300 bytes; the rest is room for JSON.
const MaxLine = 1024

// maxTarget bounds a "host:port" target: a 253-byte name, a trailing dot,
// a colon and five digits fit with room to spare.
const maxTarget = 300

// maxReason bounds a refusal reason on the wire.
const maxReason = 64

// Errors about the wire. Each decode error wraps ErrMalformed, so a caller
// can tell bad input from a network failure.
var (
	// ErrMalformed is wrapped by every error about a line that does not
	// decode as the message expected.
	ErrMalformed = errors.New("egresslane: malformed line")
	// ErrLineTooLong is returned when no newline came within MaxLine bytes.
	ErrLineTooLong = errors.New("egresslane: line too long")
)

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

// readLine reads one line, one byte at a time so that nothing after the
// newline is consumed (raw bytes follow a verdict). It returns the line
// without its newline.
func readLine(r io.Reader) ([]byte, error) {
	buf := make([]byte, 0, 128)
	var b [1]byte
	for len(buf) < MaxLine {
		n, err := r.Read(b[:])
		if n == 1 {
			if b[0] == '\n' {
				return buf, nil
			}
			buf = append(buf, b[0])
			continue
		}
		if err != nil {
			if errors.Is(err, io.EOF) && len(buf) > 0 {
				return nil, fmt.Errorf("egresslane: read line: %w", io.ErrUnexpectedEOF)
			}
			return nil, fmt.Errorf("egresslane: read line: %w", err)
		}
	}
	return nil, ErrLineTooLong
}

// writeLine writes v as one JSON line.
func writeLine(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("egresslane: encode line: %w", err)
	}
	b = append(b, '\n')
	if len(b) > MaxLine {
		return ErrLineTooLong
	}
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("egresslane: write line: %w", err)
	}
	return nil
}

// decodeStrict walks one JSON object. Every key must be in allowed (exact
// spelling) and appear at most once; set receives each value's raw bytes.
// It returns the keys seen.
func decodeStrict(line []byte, allowed []string, set func(key string, raw json.RawMessage) error) (map[string]bool, error) {
	if !utf8.Valid(line) {
		return nil, malformed("not UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, malformed("not a JSON object")
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		key, ok := tok.(string)
		if err != nil || !ok {
			return nil, malformed("bad key")
		}
		if !containsExact(allowed, key) {
			return nil, malformed("unknown key")
		}
		if seen[key] {
			return nil, malformed("duplicate key %q", key)
		}
		seen[key] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, malformed("bad value for %q", key)
		}
		if err := set(key, raw); err != nil {
			return nil, err
		}
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return nil, malformed("unterminated object")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, malformed("data after the object")
	}
	return seen, nil
}

func containsExact(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// decodeVersion accepts exactly the JSON number 1.
func decodeVersion(raw json.RawMessage) error {
	if string(raw) != "1" {
		return malformed("unsupported version")
	}
	return nil
}

// decodeString accepts a JSON string (not null, not another type).
func decodeString(raw json.RawMessage, key string) (string, error) {
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", malformed("%q is not a string", key)
	}
	return s, nil
}

// hello is the worker's first line.
type hello struct {
	V int `json:"v"`
}

// decodeHello accepts exactly {"v":1}.
func decodeHello(line []byte) error {
	seen, err := decodeStrict(line, []string{"v"}, func(_ string, raw json.RawMessage) error {
		return decodeVersion(raw)
	})
	if err != nil {
		return err
	}
	if !seen["v"] {
		return malformed("missing version")
	}
	return nil
}

// job is the CP's request to dial one target.
type job struct {
	V      int    `json:"v"`
	Target string `json:"target"`
}

// decodeJob accepts exactly {"v":1,"target":"host:port"} with a valid
// target (see ValidTarget) and returns the target.
func decodeJob(line []byte) (string, error) {
	var target string
	seen, err := decodeStrict(line, []string{"v", "target"}, func(key string, raw json.RawMessage) error {
		if key == "v" {
			return decodeVersion(raw)
		}
		s, err := decodeString(raw, key)
		target = s
		return err
	})
	if err != nil {
		return "", err
	}
	if !seen["v"] || !seen["target"] {
		return "", malformed("missing version or target")
	}
	if err := ValidTarget(target); err != nil {
		return "", err
	}
	return target, nil
}

// verdict is the worker's answer to a job.
type verdict struct {
	OK     bool   `json:"ok"`
	Reason string `json:"reason,omitempty"`
}

// decodeVerdict accepts exactly {"ok":true} or {"ok":false,"reason":r}
// with r a valid reason (see validReason).
func decodeVerdict(line []byte) (verdict, error) {
	var v verdict
	seen, err := decodeStrict(line, []string{"ok", "reason"}, func(key string, raw json.RawMessage) error {
		if key == "ok" {
			switch string(raw) {
			case "true", "false":
				v.OK = string(raw) == "true"
				return nil
			}
			return malformed("%q is not a boolean", key)
		}
		s, err := decodeString(raw, key)
		v.Reason = s
		return err
	})
	switch {
	case err != nil:
		return verdict{}, err
	case !seen["ok"]:
		return verdict{}, malformed("missing ok")
	case v.OK && seen["reason"]:
		return verdict{}, malformed("reason with ok")
	case !v.OK && !validReason(v.Reason):
		return verdict{}, malformed("missing or invalid reason")
	}
	return v, nil
}

// validReason reports whether r is a reason code we pass on: 1 to 64
// bytes of lowercase letters, digits and '-', not starting with '-'.
func validReason(r string) bool {
	if r == "" || len(r) > maxReason || r[0] == '-' {
		return false
	}
	for i := 0; i < len(r); i++ {
		c := r[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// ValidTarget checks a job's target: "host:port" where host is a DNS name,
// an IPv4 address, or a bracketed IPv6 address without a zone, and port is
// 1 to 65535 in decimal without leading zeros. It says nothing about
// whether the target may be reached; that is netguard's to judge. Errors
// wrap ErrMalformed.
func ValidTarget(s string) error {
	if len(s) == 0 || len(s) > maxTarget {
		return malformed("empty or overlong target")
	}
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return malformed("target has no port")
	}
	host, port := s[:i], s[i+1:]
	if !validPort(port) {
		return malformed("invalid port")
	}
	if strings.HasPrefix(host, "[") {
		if !strings.HasSuffix(host, "]") || len(host) < 3 {
			return malformed("unterminated IPv6 literal")
		}
		a, err := netip.ParseAddr(host[1 : len(host)-1])
		if err != nil || !a.Is6() || a.Zone() != "" {
			return malformed("invalid IPv6 literal")
		}
		return nil
	}
	if strings.IndexByte(host, ':') >= 0 {
		return malformed("IPv6 literal must be in brackets")
	}
	if a, err := netip.ParseAddr(host); err == nil && a.Is4() {
		return nil
	}
	if !validHostName(host) {
		return malformed("invalid host name")
	}
	return nil
}

// validPort accepts 1 to 5 decimal digits naming 1 to 65535, with no
// leading zero.
func validPort(p string) bool {
	if len(p) == 0 || len(p) > 5 || p[0] == '0' {
		return false
	}
	n := 0
	for i := 0; i < len(p); i++ {
		if p[i] < '0' || p[i] > '9' {
			return false
		}
		n = n*10 + int(p[i]-'0')
	}
	return n >= 1 && n <= 65535
}

// validHostName accepts ASCII letters, digits, '-' and '_' in
// dot-separated labels of 1 to 63 bytes, 253 bytes in all, one trailing
// dot allowed: nothing a resolver or a log line could misread.
func validHostName(h string) bool {
	h = strings.TrimSuffix(h, ".")
	if h == "" || len(h) > 253 {
		return false
	}
	for label := range strings.SplitSeq(h, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}
