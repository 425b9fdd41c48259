package auditlog

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"
)

// HashSize is the size of every hash in the log (SHA-256).
const HashSize = 32

// maxCheckpointText bounds a checkpoint body; ours are well under 1 KiB.
const maxCheckpointText = 4096

// strictB64 refuses non-canonical base64 (stray bits in the last symbol), so
// that flipping any bit of an encoded hash changes or breaks it.
var strictB64 = base64.StdEncoding.Strict()

// decodeB64 decodes canonical standard base64. It refuses the carriage
// returns and newlines that encoding/base64 skips even when strict, so a
// value has exactly one encoding (a checkpoint or proof line with a
// stray "\r" does not parse to the same hash as the line without).
func decodeB64(s string) ([]byte, error) {
	if strings.ContainsAny(s, "\r\n") {
		return nil, errors.New("line break in base64")
	}
	return strictB64.DecodeString(s)
}

// ErrBadCheckpoint is returned (wrapped) for a checkpoint body that is not
// exactly origin, size and root hash lines; test with errors.Is.
var ErrBadCheckpoint = errors.New("auditlog: malformed checkpoint")

// Checkpoint is the body of a signed checkpoint in the C2SP tlog-checkpoint
// form: the origin line, the tree size and the root hash.
type Checkpoint struct {
	Origin string
	Size   uint64
	Root   []byte
}

// KeyName is the name of a deployment's audit key in signed notes:
// "<deployment>/audit". Origins of its tenants' logs extend it.
func KeyName(deployment string) string { return deployment + "/audit" }

// Origin is the origin line of a tenant's log: "<deployment>/audit/<tenant>".
// It binds a checkpoint to one deployment and one tenant.
func Origin(deployment, tenant string) string { return KeyName(deployment) + "/" + tenant }

// Marshal returns the checkpoint body: three lines, each ending in "\n".
func (c Checkpoint) Marshal() []byte {
	return []byte(c.Origin + "\n" + strconv.FormatUint(c.Size, 10) + "\n" + base64.StdEncoding.EncodeToString(c.Root) + "\n")
}

// ParseCheckpoint parses a checkpoint body strictly: a non-empty origin of
// printable characters, a decimal size without leading zeros, a canonical
// base64 SHA-256 root, and nothing else (this log writes no extension lines,
// so it accepts none). golang.org/x/mod/sumdb/tlog.ParseTree cannot be used:
// it fixes the origin line to the Go checksum database's.
func ParseCheckpoint(text []byte) (Checkpoint, error) {
	var c Checkpoint
	if len(text) > maxCheckpointText {
		return c, fmt.Errorf("%w: too long", ErrBadCheckpoint)
	}
	s := string(text)
	if !strings.HasSuffix(s, "\n") {
		return c, fmt.Errorf("%w: no final newline", ErrBadCheckpoint)
	}
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	if len(lines) != 3 {
		return c, fmt.Errorf("%w: want 3 lines, got %d", ErrBadCheckpoint, len(lines))
	}
	if lines[0] == "" || !printable(lines[0]) {
		return c, fmt.Errorf("%w: bad origin line", ErrBadCheckpoint)
	}
	size, err := parseDecimal(lines[1])
	if err != nil {
		return c, fmt.Errorf("%w: size: %v", ErrBadCheckpoint, err)
	}
	root, err := decodeB64(lines[2])
	if err != nil || len(root) != HashSize {
		return c, fmt.Errorf("%w: root hash is not base64 of %d bytes", ErrBadCheckpoint, HashSize)
	}
	return Checkpoint{Origin: lines[0], Size: size, Root: root}, nil
}

// parseDecimal parses a canonical unsigned decimal (no sign, no leading
// zero, at most 2^63-1).
func parseDecimal(s string) (uint64, error) {
	if s == "" || len(s) > 19 || (len(s) > 1 && s[0] == '0') {
		return 0, errors.New("not a canonical decimal")
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, errors.New("not a canonical decimal")
		}
	}
	n, err := strconv.ParseUint(s, 10, 63)
	if err != nil {
		return 0, errors.New("out of range")
	}
	return n, nil
}

func printable(s string) bool {
	for _, r := range s {
		if r < 0x21 || r > 0x7e {
			return false
		}
	}
	return true
}

// NewSigner returns the signed-note signer of a deployment's audit key.
// x/mod's note.NewSigner takes only the encoded private key string, so the
// string is built here from the key; it never leaves this function.
func NewSigner(deployment string, priv ed25519.PrivateKey) (note.Signer, error) {
	pub, ok := priv.Public().(ed25519.PublicKey)
	if !ok || len(priv) != ed25519.PrivateKeySize {
		return nil, errors.New("auditlog: not an Ed25519 private key")
	}
	vkey, err := VerifierKey(deployment, pub)
	if err != nil {
		return nil, err
	}
	// vkey is name+hash+base64(0x01||pub); the signer key shares name and hash.
	parts := strings.SplitN(vkey, "+", 3)
	if len(parts) != 3 {
		return nil, errors.New("auditlog: unexpected verifier key form")
	}
	skey := "PRIVATE+KEY+" + parts[0] + "+" + parts[1] + "+" + base64.StdEncoding.EncodeToString(append([]byte{1}, priv.Seed()...))
	s, err := note.NewSigner(skey)
	if err != nil {
		return nil, fmt.Errorf("auditlog: signer: %w", err)
	}
	return s, nil
}

// VerifierKey returns the audit verifier key of a deployment in the signed
// note verifier format "name+hash+base64" (name = KeyName(deployment)).
func VerifierKey(deployment string, pub ed25519.PublicKey) (string, error) {
	vkey, err := note.NewEd25519VerifierKey(KeyName(deployment), pub)
	if err != nil {
		return "", fmt.Errorf("auditlog: verifier key: %w", err)
	}
	return vkey, nil
}

// ParseVerifierKey parses a verifier key ("name+hash+base64"), surrounding
// whitespace allowed, and checks that its name has the form
// "<deployment>/audit". It returns the verifier and the deployment.
func ParseVerifierKey(vkey string) (note.Verifier, string, error) {
	v, err := note.NewVerifier(strings.TrimSpace(vkey))
	if err != nil {
		return nil, "", fmt.Errorf("auditlog: verifier key: %w", err)
	}
	dep, ok := strings.CutSuffix(v.Name(), "/audit")
	if !ok || dep == "" {
		return nil, "", fmt.Errorf("auditlog: verifier key name %q is not <deployment>/audit", v.Name())
	}
	return v, dep, nil
}

// KeyRing is every audit key a reader trusts for one deployment: while
// the audit key rotates and after, checkpoints signed by the active, a
// staged, a previous or a retired key all verify. It is a note.Verifier
// (its first key's name and hash) so that it goes wherever one key does;
// OpenCheckpoint looks a signature's key up in the whole ring.
type KeyRing []note.Verifier

// Name is the keys' common name, "<deployment>/audit".
func (r KeyRing) Name() string { return r[0].Name() }

// KeyHash is the first (active) key's hash.
func (r KeyRing) KeyHash() uint32 { return r[0].KeyHash() }

// Verify checks sig with the first key; note.Open goes through lookup,
// which picks the key a signature names.
func (r KeyRing) Verify(msg, sig []byte) bool { return r[0].Verify(msg, sig) }

// lookup returns the note.Verifiers for v: all of a KeyRing's keys, or v alone.
func lookup(v note.Verifier) note.Verifiers {
	if r, ok := v.(KeyRing); ok {
		return note.VerifierList(r...)
	}
	return note.VerifierList(v)
}

// NewKeyRing makes the ring of deployment's audit keys (the first signs,
// see pki.Bundle.AuditKeys).
func NewKeyRing(deployment string, keys []ed25519.PublicKey) (KeyRing, error) {
	if len(keys) == 0 {
		return nil, errors.New("auditlog: no audit key")
	}
	var r KeyRing
	for _, k := range keys {
		vkey, err := VerifierKey(deployment, k)
		if err != nil {
			return nil, err
		}
		v, err := note.NewVerifier(vkey)
		if err != nil {
			return nil, fmt.Errorf("auditlog: verifier: %w", err)
		}
		r = append(r, v)
	}
	return r, nil
}

// ParseKeyRing parses one verifier key per line (blank lines ignored), as
// `better-compute audit key` prints them, all for one deployment.
func ParseKeyRing(text string) (KeyRing, string, error) {
	var r KeyRing
	var dep string
	for _, line := range strings.Split(text, "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		v, d, err := ParseVerifierKey(line)
		if err != nil {
			return nil, "", err
		}
		if dep != "" && d != dep {
			return nil, "", fmt.Errorf("auditlog: verifier keys name two deployments (%q, %q)", dep, d)
		}
		dep = d
		r = append(r, v)
	}
	if len(r) == 0 {
		return nil, "", errors.New("auditlog: no verifier key")
	}
	return r, dep, nil
}

// SignCheckpoint signs c as a signed note with s.
func SignCheckpoint(c Checkpoint, s note.Signer) ([]byte, error) {
	msg, err := note.Sign(&note.Note{Text: string(c.Marshal())}, s)
	if err != nil {
		return nil, fmt.Errorf("auditlog: sign checkpoint: %w", err)
	}
	return msg, nil
}

// Reasons OpenCheckpoint gives for refusing a signed checkpoint; verify
// reports them as finding kinds.
const (
	// ReasonBadSignature: no signature by the verifier's key (for instance
	// a checkpoint re-signed with another key).
	ReasonBadSignature = "checkpoint-bad-signature"
	// ReasonEdited: the signature by the verifier's key does not match the
	// text, the note or its body is malformed, or the origin is wrong.
	ReasonEdited = "checkpoint-edited"
)

// CheckpointError is OpenCheckpoint's refusal; Reason is ReasonBadSignature
// or ReasonEdited.
type CheckpointError struct {
	Reason string
	Err    error
}

// Error returns the reason and the cause.
func (e *CheckpointError) Error() string { return e.Reason + ": " + e.Err.Error() }

// Unwrap returns the cause.
func (e *CheckpointError) Unwrap() error { return e.Err }

// OpenCheckpoint verifies a signed checkpoint under v and parses its body;
// when origin is not empty the body's origin must equal it. Every signature
// on the note must be canonical base64 and verify: a checkpoint is accepted
// only exactly as signed.
func OpenCheckpoint(msg []byte, v note.Verifier, origin string) (Checkpoint, error) {
	n, err := note.Open(msg, lookup(v))
	if err != nil {
		var unverified *note.UnverifiedNoteError
		if errors.As(err, &unverified) {
			return Checkpoint{}, &CheckpointError{ReasonBadSignature, fmt.Errorf("not signed by %s", v.Name())}
		}
		return Checkpoint{}, &CheckpointError{ReasonEdited, err}
	}
	for _, s := range append(n.Sigs, n.UnverifiedSigs...) {
		if _, err := decodeB64(s.Base64); err != nil {
			return Checkpoint{}, &CheckpointError{ReasonEdited, errors.New("non-canonical signature encoding")}
		}
	}
	if len(n.UnverifiedSigs) > 0 {
		return Checkpoint{}, &CheckpointError{ReasonEdited, errors.New("extra signatures")}
	}
	c, err := ParseCheckpoint([]byte(n.Text))
	if err != nil {
		return Checkpoint{}, &CheckpointError{ReasonEdited, err}
	}
	if origin != "" && c.Origin != origin {
		return Checkpoint{}, &CheckpointError{ReasonEdited, fmt.Errorf("origin %q, want %q", c.Origin, origin)}
	}
	return c, nil
}

// checkpointBody returns the unverified body of a signed note (for prove,
// which checks its own proof against it before writing it).
func checkpointBody(msg []byte) (Checkpoint, error) {
	i := strings.LastIndex(string(msg), "\n\n")
	if i < 0 {
		return Checkpoint{}, fmt.Errorf("%w: not a signed note", ErrBadCheckpoint)
	}
	return ParseCheckpoint(msg[:i+1])
}
