// Package chainlog is the bastion's on-machine audit log: an append-only
// file of JSON lines in which each event names the hash of the one before
// it, so that an edit, a deleted or reordered line, or a torn last line is
// found by Verify at the line where it happened.
//
// The chain makes tampering evident, not impossible: whoever can write the
// file can also rewrite every hash after an edit. Forwarding events (Since)
// to the control plane, which keeps the last hash it saw, anchors the chain
// outside this machine.
//
// # Hash
//
// Each line is exactly the bytes encoding/json.Marshal produces for its
// Event (members in the struct's order: seq, time_ms, kind, lane, reason,
// peer, detail, prev, hash; empty lane, reason, peer and detail left out;
// no spaces), followed by "\n". Event.Hash is the lowercase hex SHA-256 of
// that same encoding made with Hash set to "" (so it ends `"hash":""}`,
// without the newline). Event.Prev is the previous event's Hash, and 64
// zeros (Genesis) for the first event. A line that is not byte for byte
// the encoding of the event it decodes to fails as "hash-mismatch".
package chainlog

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"unicode/utf8"
)

// Genesis is the Prev of the first event.
var Genesis = strings.Repeat("0", 64)

// MaxFieldBytes is the longest Lane, Reason, Peer or Detail; Append cuts
// longer ones.
const MaxFieldBytes = 256

// MaxLineBytes is the longest line Verify reads (a line of fields at
// their limits, each character escaped, is shorter).
const MaxLineBytes = 16 << 10

// Event is one line of the log.
type Event struct {
	Seq    uint64 `json:"seq"`              // 1, 2, 3, ...
	TimeMS int64  `json:"time_ms"`          // Unix milliseconds, from the log's clock
	Kind   string `json:"kind"`             // "accept" | "refuse" | "pair" | "unpair" | "grants" | ... ([a-z.-]{1,32})
	Lane   string `json:"lane,omitempty"`   // e.g. "inference/ollama", "service/db", "egress"
	Reason string `json:"reason,omitempty"` // refusal reason code
	Peer   string `json:"peer,omitempty"`   // remote address as seen in the tunnel
	Detail string `json:"detail,omitempty"` // short, no secrets (<= MaxFieldBytes; Append cuts longer)
	Prev   string `json:"prev"`             // the previous event's Hash (Genesis for the first)
	Hash   string `json:"hash"`             // see the package doc
}

// The reasons a chain is broken (BrokenError.Reason).
const (
	ReasonBadJSON       = "bad-json"       // not one strict JSON Event, or a field out of shape
	ReasonSeqGap        = "seq-gap"        // seq is not one more than the previous line's
	ReasonPrevMismatch  = "prev-mismatch"  // prev is not the previous line's hash
	ReasonHashMismatch  = "hash-mismatch"  // hash is not the event's, or the line is not its canonical encoding
	ReasonTruncatedLine = "truncated-line" // the file ends inside a line (no final newline)
)

// BrokenError says where and why a chain is broken. Line counts from 1.
type BrokenError struct {
	Line   int
	Reason string
}

func (e *BrokenError) Error() string {
	return fmt.Sprintf("chainlog: chain broken at line %d: %s", e.Line, e.Reason)
}

// Verify reads a whole log from r and checks every line; n is how many
// events it holds. A broken chain is a *BrokenError; a read failure is
// returned wrapped.
func Verify(r io.Reader) (n uint64, err error) {
	tail, err := scan(r, nil)
	return tail.seq, err
}

// VerifyFile is Verify of the file at path.
func VerifyFile(path string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("chainlog: verify: %w", err)
	}
	defer f.Close()
	return Verify(f)
}

// tail is the end of a verified chain: the last seq and hash.
type tail struct {
	seq  uint64
	hash string
}

// scan verifies the chain in r line by line, calling visit (if not nil)
// with each verified event; visit returning false stops the scan early
// (the lines after are then not checked).
func scan(r io.Reader, visit func(Event) bool) (tail, error) {
	br := bufio.NewReaderSize(r, MaxLineBytes+1)
	t := tail{hash: Genesis}
	for line := 1; ; line++ {
		raw, err := br.ReadSlice('\n')
		switch {
		case err == io.EOF && len(raw) == 0:
			return t, nil
		case err == io.EOF:
			return t, &BrokenError{Line: line, Reason: ReasonTruncatedLine}
		case errors.Is(err, bufio.ErrBufferFull):
			return t, &BrokenError{Line: line, Reason: ReasonBadJSON}
		case err != nil:
			return t, fmt.Errorf("chainlog: read line %d: %w", line, err)
		}
		e, reason := checkLine(raw[:len(raw)-1], t)
		if reason != "" {
			return t, &BrokenError{Line: line, Reason: reason}
		}
		t = tail{seq: e.Seq, hash: e.Hash}
		if visit != nil && !visit(e) {
			return t, nil
		}
	}
}

// checkLine decodes one line (without its newline) and checks it follows
// t; it returns the event, or the reason the chain breaks here.
func checkLine(raw []byte, t tail) (Event, string) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var e Event
	if err := dec.Decode(&e); err != nil {
		return Event{}, ReasonBadJSON
	}
	if _, err := dec.Token(); err != io.EOF {
		return Event{}, ReasonBadJSON
	}
	if !validShape(e) {
		return Event{}, ReasonBadJSON
	}
	if e.Seq != t.seq+1 {
		return Event{}, ReasonSeqGap
	}
	if e.Prev != t.hash {
		return Event{}, ReasonPrevMismatch
	}
	want, line := seal(e)
	if e.Hash != want || !bytes.Equal(raw, line) {
		return Event{}, ReasonHashMismatch
	}
	return e, ""
}

// seal returns the hash of e (its encoding with Hash "") and the line
// encoding of e with that hash, without the newline.
func seal(e Event) (hash string, line []byte) {
	e.Hash = ""
	b, err := json.Marshal(e)
	if err != nil {
		panic("chainlog: an Event always encodes: " + err.Error())
	}
	sum := sha256.Sum256(b)
	e.Hash = hex.EncodeToString(sum[:])
	line, err = json.Marshal(e)
	if err != nil {
		panic("chainlog: an Event always encodes: " + err.Error())
	}
	return e.Hash, line
}

// validShape reports whether e's fields are in shape: a kind, hex hashes,
// short valid-UTF-8 text fields.
func validShape(e Event) bool {
	if !ValidKind(e.Kind) || !isHash(e.Prev) || !isHash(e.Hash) {
		return false
	}
	for _, s := range []string{e.Lane, e.Reason, e.Peer, e.Detail} {
		if len(s) > MaxFieldBytes || !utf8.ValidString(s) {
			return false
		}
	}
	return true
}

// ValidKind reports whether k is an event kind: 1..32 of [a-z.-].
func ValidKind(k string) bool {
	if k == "" || len(k) > 32 {
		return false
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; !(c >= 'a' && c <= 'z' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}

func isHash(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
