package approval

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Limits of the one-use approvals.
const (
	// RequestTTL is how long a request can be approved and spent.
	RequestTTL = 5 * time.Minute
	// MaxPending is how many unexpired, unspent requests may wait.
	MaxPending = 64
	// MaxSummary is the longest summary, in runes: a longer one is
	// refused (ReasonSummaryTooLong), never clipped, since the person
	// approves what the text shows.
	MaxSummary = 64 << 10
	// maxOp is the longest op name.
	maxOp = 64
	// keepExpired is how long a request is kept past Expires, so a late
	// spend or approve says expired (or spent), not unknown.
	keepExpired = 15 * time.Minute
)

// lowerB32 is lowercase, unpadded base32 (as internal/ids uses).
var lowerB32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// Request is one approval request: the control plane asked for op with
// arguments of the given digest; the person approves it on the machine.
type Request struct {
	ID       string    `json:"id"` // "apr_" + 20 base32
	Op       string    `json:"op"`
	Digest   string    `json:"digest"`  // Digest(op, canonical args)
	Summary  string    `json:"summary"` // the text shown to the person
	Created  time.Time `json:"created"`
	Expires  time.Time `json:"expires"` // Created + RequestTTL
	Approved bool      `json:"approved"`
}

// storedRequest is a Request as kept, with its spent marker.
type storedRequest struct {
	Request
	Spent bool `json:"spent"`
}

// approvalState is the plaintext of approvals.sealed.
type approvalState struct {
	V        int             `json:"v"`
	Bastion  string          `json:"bastion"`
	Requests []storedRequest `json:"requests"`
	Refused  []time.Time     `json:"refused"` // refused writes, newest last
}

// Digest returns the hex SHA-256 of op, a NUL and the canonical arguments:
// what an approval is bound to.
func Digest(op string, canonicalArgs []byte) string {
	h := sha256.New()
	h.Write([]byte(op))
	h.Write([]byte{0})
	h.Write(canonicalArgs)
	return hex.EncodeToString(h.Sum(nil))
}

// newID returns prefix + 20 random lowercase base32 characters (100 bits).
func newID(prefix string) (string, error) {
	var b [13]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("approval: random id: %w", err)
	}
	return prefix + lowerB32.EncodeToString(b[:])[:20], nil
}

// loadState reads approvals.sealed (missing: empty). One that does not
// open, or is not this bastion's, is ReasonStateDamaged: the store then
// fails closed (no approvals, writes locked) until the file is removed.
func (s *Store) loadState() (approvalState, error) {
	st := approvalState{V: fileVersion, Bastion: s.bastion}
	ok, err := s.loadSealed(approvalsFile, purposeApprovals, "approvals", &st)
	var re *RefusedError
	switch {
	case errors.As(err, &re):
		return st, refuse(ReasonStateDamaged, "the approvals file does not open; remove approvals.sealed to reset approvals")
	case err != nil:
		return st, err
	case ok && (st.V != fileVersion || st.Bastion != s.bastion):
		return st, refuse(ReasonStateDamaged, "the approvals file is not this bastion's")
	}
	return st, nil
}

// saveState prunes what no longer matters at now and writes the state.
func (s *Store) saveState(st approvalState, now time.Time) error {
	kept := st.Requests[:0]
	for _, r := range st.Requests {
		if now.Before(r.Expires.Add(keepExpired)) {
			kept = append(kept, r)
		}
	}
	st.Requests = kept
	st.Refused = recentRefusals(st.Refused, now)
	return s.saveSealed(approvalsFile, purposeApprovals, "approvals", st)
}

// updateState loads the state, lets fn change it and saves it, all under
// the lock.
func (s *Store) updateState(fn func(st *approvalState, now time.Time) error) error {
	return s.withLock(func() error {
		st, err := s.loadState()
		if err != nil {
			return err
		}
		now := s.clock.Now()
		if err := fn(&st, now); err != nil {
			return err
		}
		return s.saveState(st, now)
	})
}

// Ask files a new pending request for op bound to digest, expiring
// RequestTTL from now. With MaxPending unexpired, unspent requests waiting
// it is refused ReasonTooManyPending. The summary is kept with control
// characters replaced, since it is shown on the person's terminal; a
// summary longer than MaxSummary runes is refused ReasonSummaryTooLong.
func (s *Store) Ask(op, digest, summary string) (Request, error) {
	if !validOp(op) || !validDigest(digest) {
		return Request{}, refuse(ReasonBadRequest, "op or digest malformed")
	}
	if utf8.RuneCountInString(summary) > MaxSummary {
		return Request{}, refuse(ReasonSummaryTooLong, "the request is too long to show whole on the machine")
	}
	id, err := newID("apr_")
	if err != nil {
		return Request{}, err
	}
	var r Request
	err = s.updateState(func(st *approvalState, now time.Time) error {
		n := 0
		for _, q := range st.Requests {
			if !q.Spent && now.Before(q.Expires) {
				n++
			}
		}
		if n >= MaxPending {
			return refuse(ReasonTooManyPending, fmt.Sprintf("%d requests already wait for approval", n))
		}
		r = Request{ID: id, Op: op, Digest: digest, Summary: cleanSummary(summary), Created: now, Expires: now.Add(RequestTTL)}
		st.Requests = append(st.Requests, storedRequest{Request: r})
		return nil
	})
	if err != nil {
		return Request{}, err
	}
	return r, nil
}

// validOp reports whether op is 1..maxOp characters of [a-z0-9:._-].
func validOp(op string) bool {
	if op == "" || len(op) > maxOp {
		return false
	}
	for i := 0; i < len(op); i++ {
		c := op[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.IndexByte(":._-", c) >= 0) {
			return false
		}
	}
	return true
}

// validDigest reports whether d is 64 lowercase hex characters.
func validDigest(d string) bool {
	if len(d) != 2*sha256.Size {
		return false
	}
	_, err := hex.DecodeString(d)
	return err == nil && strings.ToLower(d) == d
}

// cleanSummary replaces control and invalid characters with '?'.
func cleanSummary(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r == utf8.RuneError || unicode.IsControl(r) || !unicode.IsPrint(r) {
			r = '?'
		}
		b.WriteRune(r)
	}
	return b.String()
}
