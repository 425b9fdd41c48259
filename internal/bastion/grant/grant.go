// Package grant defines the grant documents that say what the control plane
// (CP) may do on a bastion, and the rules that read them. The CP signs each
// grant with its grant key as a signed note (golang.org/x/mod/sumdb/note,
// Ed25519); the bastion verifies it under the key it pinned at pairing and
// refuses anything else with a stable reason. Several grants combine into
// one Policy in which a deny in any grant beats every allow.
//
// The package is pure (no I/O, no clock of its own) so that the CP, which
// signs, and the bastion, which verifies, run the same checks.
package grant

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/sumdb/note"
)

// The capability families a grant can allow or deny.
const (
	FamilyInference = "inference" // the inference forwards (ollama, llm, pii)
	FamilyModels    = "models"    // ollama's model-store paths (/api/pull, push, delete, create, copy)
	FamilyServices  = "services"  // service slots (with a reach grant naming the server)
	FamilyEgress    = "egress"    // the egress lane
)

// Families returns every known family, sorted, as a new slice. It is a
// function rather than a package variable so that no importer can widen
// what Verify accepts by appending to it.
func Families() []string {
	return []string{FamilyEgress, FamilyInference, FamilyModels, FamilyServices}
}

// knownFamily reports whether f is one of Families.
func knownFamily(f string) bool {
	switch f {
	case FamilyEgress, FamilyInference, FamilyModels, FamilyServices:
		return true
	}
	return false
}

// KeyName is the name of the grant key in its note key strings. Verify
// refuses a pinned key with any other name.
const KeyName = "bc-grant"

// MaxGrantBytes is the largest signed grant message Verify reads.
const MaxGrantBytes = 16 << 10

// Limits on a grant's lists and fields.
const (
	// MaxModels is how many models one grant may name.
	MaxModels = 16
	// MaxReach is how many service-slot servers one grant may name.
	MaxReach = 64
	// MaxModelLen is the longest model name.
	MaxModelLen = 128
	// MaxIDLen is the longest grant id.
	MaxIDLen = 64
	// ClockSkew is how far in the future IssuedAt may be before a grant
	// counts as not (yet) valid.
	ClockSkew = 5 * time.Minute
)

// Version is the only Doc.V this package reads and writes.
const Version = 1

// Doc is one grant: what the CP may (Allow) and may not (Deny) do on one
// bastion, between IssuedAt and ExpiresAt (Unix milliseconds).
type Doc struct {
	V         int      `json:"v"`                // Version
	ID        string   `json:"id"`               // grant id, e.g. "grt_..." (1..64 chars [a-z0-9_-])
	Bastion   string   `json:"bastion"`          // the bastion (node) id it is for (ids.ValidName)
	Allow     []string `json:"allow"`            // families allowed
	Deny      []string `json:"deny,omitempty"`   // families denied; beats any allow in any grant
	Models    []string `json:"models,omitempty"` // ollama model names in scope (e.g. "llama3:8b"); each 1..128 printable ASCII, no spaces
	Reach     []string `json:"reach,omitempty"`  // service-slot server names the CP may reach ([a-z0-9][a-z0-9-]{0,62})
	IssuedAt  int64    `json:"issued_at_ms"`     // when the CP issued it
	ExpiresAt int64    `json:"expires_at_ms"`    // the first instant it is no longer valid
}

// Reason is a stable lowercase code saying why a grant was refused; ""
// means it was accepted.
type Reason string

// The reasons Verify refuses a grant with.
const (
	ReasonMalformed     Reason = "grant-malformed"      // not a note, not JSON, bad field shape, unknown JSON field, trailing data
	ReasonSignature     Reason = "grant-signature"      // not signed by the pinned key (or signed by another key only), or the pinned key is unusable
	ReasonUnknownFamily Reason = "grant-unknown-family" // a family in allow or deny that is not in Families
	ReasonOtherBastion  Reason = "grant-other-bastion"  // Doc.Bastion is not this bastion
	ReasonExpired       Reason = "grant-expired"        // now >= ExpiresAt (or IssuedAt in the future by > ClockSkew)
	ReasonTooLarge      Reason = "grant-too-large"      // message over MaxGrantBytes
)

// RefusedError is the error Sign returns for a Doc that Verify would
// refuse; Reason says why.
type RefusedError struct {
	Reason Reason
	Msg    string
}

func (e *RefusedError) Error() string { return "grant: " + string(e.Reason) + ": " + e.Msg }

// GenerateKey makes a new Ed25519 grant key pair named KeyName, as note
// key strings: skey is secret (keep it 0600, never log it), vkey is what a
// bastion pins.
func GenerateKey() (skey, vkey string, err error) {
	skey, vkey, err = note.GenerateKey(rand.Reader, KeyName)
	if err != nil {
		return "", "", fmt.Errorf("grant: generate key: %w", err)
	}
	return skey, vkey, nil
}

// Sign checks d as Verify would (all but time and bastion) and returns it
// as a note signed with skey: the JSON on one line, a newline, then the
// signature block. A Doc Verify would refuse is a *RefusedError.
func Sign(skey string, d Doc) ([]byte, error) {
	if r, msg := check(d); r != "" {
		return nil, &RefusedError{Reason: r, Msg: msg}
	}
	signer, err := note.NewSigner(skey)
	if err != nil {
		// The error of NewSigner never carries the key; keep it that way.
		return nil, errors.New("grant: sign: the signing key is malformed")
	}
	if signer.Name() != KeyName {
		return nil, fmt.Errorf("grant: sign: the signing key is named %q, want %q", signer.Name(), KeyName)
	}
	body, err := json.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("grant: sign: encode: %w", err)
	}
	msg, err := note.Sign(&note.Note{Text: string(body) + "\n"}, signer)
	if err != nil {
		return nil, fmt.Errorf("grant: sign: %w", err)
	}
	if len(msg) > MaxGrantBytes {
		return nil, &RefusedError{Reason: ReasonTooLarge, Msg: fmt.Sprintf("%d bytes signed, at most %d", len(msg), MaxGrantBytes)}
	}
	return msg, nil
}

// Verify checks msg, a signed grant, for this bastion at now under the
// pinned verifier key vkey, and returns the grant. Reason "" means valid;
// any other Reason means refuse it (the Doc is then zero). The checks run
// in this order: size, key, note and signature, JSON, fields, families,
// bastion, time.
func Verify(msg []byte, vkey, bastion string, now time.Time) (Doc, Reason) {
	if len(msg) > MaxGrantBytes {
		return Doc{}, ReasonTooLarge
	}
	v, err := note.NewVerifier(vkey)
	if err != nil || v.Name() != KeyName {
		return Doc{}, ReasonSignature
	}
	n, err := note.Open(msg, note.VerifierList(v))
	if err != nil {
		var unverified *note.UnverifiedNoteError
		var invalid *note.InvalidSignatureError
		if errors.As(err, &unverified) || errors.As(err, &invalid) {
			return Doc{}, ReasonSignature
		}
		return Doc{}, ReasonMalformed
	}
	d, err := decode(n.Text)
	if err != nil {
		return Doc{}, ReasonMalformed
	}
	if r, _ := check(d); r != "" {
		return Doc{}, r
	}
	if bastion == "" || d.Bastion != bastion {
		return Doc{}, ReasonOtherBastion
	}
	if !current(d, now) {
		return Doc{}, ReasonExpired
	}
	return d, ""
}

// current reports whether d is within its validity window at now.
func current(d Doc, now time.Time) bool {
	ms := now.UnixMilli()
	return ms < d.ExpiresAt && d.IssuedAt <= ms+ClockSkew.Milliseconds()
}

// fieldNames are the JSON member names of Doc, matched exactly.
var fieldNames = []string{"allow", "bastion", "deny", "expires_at_ms", "id", "issued_at_ms", "models", "reach", "v"}

// decode reads the note text strictly: exactly one line holding exactly
// one JSON object whose member names are Doc's (exact case, each at most
// once), with nothing after it.
func decode(text string) (Doc, error) {
	body, ok := strings.CutSuffix(text, "\n")
	if !ok || strings.Contains(body, "\n") {
		return Doc{}, errors.New("the grant is not one line")
	}
	if err := checkKeys([]byte(body)); err != nil {
		return Doc{}, err
	}
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	var d Doc
	if err := dec.Decode(&d); err != nil {
		return Doc{}, fmt.Errorf("decode: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Doc{}, errors.New("trailing data after the grant")
	}
	return d, nil
}

// checkKeys refuses a body that is not a JSON object, or whose members
// are not Doc's names exactly (encoding/json would match "ALLOW" to
// Allow) or repeat one.
func checkKeys(body []byte) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return errors.New("the grant is not a JSON object")
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("decode key: %w", err)
		}
		k, ok := tok.(string)
		if !ok || seen[k] || !slices.Contains(fieldNames, k) {
			return fmt.Errorf("unexpected or repeated key %q", k)
		}
		seen[k] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return fmt.Errorf("decode value: %w", err)
		}
	}
	return nil
}
