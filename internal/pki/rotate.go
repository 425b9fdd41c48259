package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// Kind names one of the bundle's rotatable keys.
type Kind string

// The rotatable keys. Each rotates in three steps, so that every party that
// checks it trusts the new key before anything is signed with it:
//
//	stage:    a new key is made and trusted everywhere (trust bundle, roots,
//	          verifier lists) but signs nothing yet;
//	activate: the staged key signs from now on; the old one is kept as
//	          "previous" and still trusted;
//	retire:   the previous key is no longer trusted (its sealed private half,
//	          if any, is deleted). A retired audit key stays a verifier of the
//	          checkpoints it signed.
const (
	KindNodeCA      Kind = keyNodeCA
	KindInternalCA  Kind = keyInternalCA
	KindCommandRoot Kind = keyCommandRoot
	KindJoinKey     Kind = keyJoin
	KindAuditKey    Kind = keyAudit
)

// Kinds lists every rotatable key, in the bundle's order.
var Kinds = []Kind{KindNodeCA, KindInternalCA, KindCommandRoot, KindJoinKey, KindAuditKey}

// ParseKind returns the Kind named s, or an error listing the valid names.
func ParseKind(s string) (Kind, error) {
	for _, k := range Kinds {
		if string(k) == s {
			return k, nil
		}
	}
	return "", fmt.Errorf("pki: unknown key %q (one of node-ca, internal-ca, command-root, join-key, audit-key)", s)
}

// isCA reports whether k is a CA (a certificate) rather than a bare key.
func (k Kind) isCA() bool { return k == KindNodeCA || k == KindInternalCA || k == KindCommandRoot }

// RetireAfter is how long after its activation a previous key stays
// trusted before RotateRetire accepts to drop it without force: one default
// node-certificate and worker-key lifetime (24 h), so that every node has
// renewed from the new node CA and every command signed under the old
// command root has expired.
const RetireAfter = 24 * time.Hour

// Errors of the rotation steps; the CLI names the next step for each.
var (
	// ErrAlreadyStaged: a staged key of this kind exists (activate it first).
	ErrAlreadyStaged = errors.New("pki: a staged key of this kind exists")
	// ErrNothingStaged: activate needs a staged key (stage one first).
	ErrNothingStaged = errors.New("pki: no staged key of this kind")
	// ErrPreviousKept: activate would replace a previous key still trusted (retire it first).
	ErrPreviousKept = errors.New("pki: the previous key of this kind is not retired")
	// ErrNothingToRetire: retire needs a previous key.
	ErrNothingToRetire = errors.New("pki: no previous key of this kind")
	// ErrTooEarly: the previous key was activated less than RetireAfter ago.
	ErrTooEarly = errors.New("pki: the previous key was replaced less than 24h ago")
)

// slot is one staged or previous key: a CA certificate or a bare Ed25519
// public key, and when it entered that state.
type slot struct {
	cert  *x509.Certificate
	pub   ed25519.PublicKey
	since time.Time
}

// slotJSON is the on-disk form of a slot.
type slotJSON struct {
	Cert  string `json:"cert,omitempty"` // PEM, for a CA
	Key   []byte `json:"key,omitempty"`  // Ed25519 public key, for a bare key
	Since int64  `json:"since"`          // unix seconds
}

func stagedName(k Kind) string   { return "staged/" + string(k) }
func previousName(k Kind) string { return "previous/" + string(k) }

// activeCert returns the active CA certificate of a CA kind.
func (b *Bundle) activeCert(k Kind) *x509.Certificate {
	switch k {
	case KindNodeCA:
		return b.NodeCA
	case KindInternalCA:
		return b.InternalCA
	case KindCommandRoot:
		return b.CommandRoot
	}
	return nil
}

func (b *Bundle) setActive(k Kind, s slot) {
	switch k {
	case KindNodeCA:
		b.NodeCA = s.cert
	case KindInternalCA:
		b.InternalCA = s.cert
	case KindCommandRoot:
		b.CommandRoot = s.cert
	case KindJoinKey:
		b.JoinKey = s.pub
	case KindAuditKey:
		b.AuditKey = s.pub
	}
}

// activeSlot returns the active key of kind k as a slot.
func (b *Bundle) activeSlot(k Kind) slot {
	switch k {
	case KindJoinKey:
		return slot{pub: b.JoinKey}
	case KindAuditKey:
		return slot{pub: b.AuditKey}
	}
	return slot{cert: b.activeCert(k)}
}

// roots returns the certificates of CA kind k a verifier trusts: the
// active one, then a staged and a previous one when present.
func (b *Bundle) roots(k Kind) []*x509.Certificate {
	out := []*x509.Certificate{b.activeCert(k)}
	for _, m := range []map[Kind]slot{b.staged, b.previous} {
		if s, ok := m[k]; ok {
			out = append(out, s.cert)
		}
	}
	return out
}

// NodeRoots are the node CAs the gateway trusts: active, staged, previous.
func (b *Bundle) NodeRoots() []*x509.Certificate { return b.roots(KindNodeCA) }

// InternalRoots are the internal CAs that verify the gateway's, the API's
// and the internal channel's certificates: active, staged, previous.
func (b *Bundle) InternalRoots() []*x509.Certificate { return b.roots(KindInternalCA) }

// CommandRoots are the command-signing roots nodes trust: active, staged, previous.
func (b *Bundle) CommandRoots() []*x509.Certificate { return b.roots(KindCommandRoot) }

func (b *Bundle) keys(k Kind) []ed25519.PublicKey {
	out := []ed25519.PublicKey{b.activeSlot(k).pub}
	for _, m := range []map[Kind]slot{b.staged, b.previous} {
		if s, ok := m[k]; ok {
			out = append(out, s.pub)
		}
	}
	return out
}

// JoinKeys are the join keys that sign trust bundles: the active one
// first, then a staged and a previous one.
func (b *Bundle) JoinKeys() []ed25519.PublicKey { return b.keys(KindJoinKey) }

// AuditKeys are the keys that verify audit checkpoints: the active one
// first, a staged and a previous one, then every retired one.
func (b *Bundle) AuditKeys() []ed25519.PublicKey {
	return append(b.keys(KindAuditKey), b.retiredAudit...)
}

// JoinSigningKeys unseals every join key in JoinKeys' order.
func (b *Bundle) JoinSigningKeys(kek KEK) ([]ed25519.PrivateKey, error) {
	out := []ed25519.PrivateKey{}
	k, err := b.JoinSigningKey(kek)
	if err != nil {
		return nil, err
	}
	out = append(out, k)
	for _, m := range []struct {
		slots map[Kind]slot
		name  string
	}{{b.staged, stagedName(KindJoinKey)}, {b.previous, previousName(KindJoinKey)}} {
		s, ok := m.slots[KindJoinKey]
		if !ok {
			continue
		}
		k, err := unsealAs[ed25519.PrivateKey](b, kek, m.name, s.pub)
		if err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, nil
}

// RotateStage makes a new key of kind k in the bundle in dir, sealed under
// kek and trusted everywhere, but used for nothing until RotateActivate.
func RotateStage(dir string, kek KEK, k Kind, clk Clock) (*Bundle, error) {
	return rotate(dir, func(b *Bundle, now time.Time) error {
		if _, ok := b.staged[k]; ok {
			return ErrAlreadyStaged
		}
		s := slot{since: now}
		if k.isCA() {
			gen := func() (crypto.Signer, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }
			if k == KindCommandRoot {
				gen = func() (crypto.Signer, error) { _, key, err := ed25519.GenerateKey(rand.Reader); return key, err }
			}
			cert, err := b.newCA(kek, stagedName(k), b.activeCert(k).Subject.CommonName, gen, now)
			if err != nil {
				return err
			}
			s.cert = cert
		} else {
			_, key, err := ed25519.GenerateKey(rand.Reader)
			if err != nil {
				return fmt.Errorf("pki: generate %s: %w", k, err)
			}
			if err := b.seal(kek, stagedName(k), key); err != nil {
				return err
			}
			s.pub = key.Public().(ed25519.PublicKey)
		}
		b.staged[k] = s
		return nil
	}, clk)
}

// RotateActivate makes the staged key of kind k the active one; the active
// one becomes the previous key, still trusted. Only the join key keeps its
// previous private half (to sign trust bundles for nodes and tokens that
// pin it); the others sign nothing once replaced and their private half is
// deleted.
func RotateActivate(dir string, kek KEK, k Kind, clk Clock) (*Bundle, error) {
	return rotate(dir, func(b *Bundle, now time.Time) error {
		st, ok := b.staged[k]
		if !ok {
			return ErrNothingStaged
		}
		if _, ok := b.previous[k]; ok {
			return ErrPreviousKept
		}
		pub := crypto.PublicKey(st.pub)
		if st.cert != nil {
			pub = st.cert.PublicKey
		}
		next, err := b.unseal(kek, stagedName(k), pub)
		if err != nil {
			return err
		}
		old := b.activeSlot(k)
		if k == KindJoinKey {
			cur, err := b.JoinSigningKey(kek)
			if err != nil {
				return err
			}
			if err := b.seal(kek, previousName(k), cur); err != nil {
				return err
			}
		}
		if err := b.seal(kek, string(k), next); err != nil {
			return err
		}
		delete(b.sealed, stagedName(k))
		delete(b.staged, k)
		old.since = now
		b.previous[k] = old
		b.setActive(k, st)
		return nil
	}, clk)
}

// RotateRetire stops trusting the previous key of kind k. It refuses
// within RetireAfter of the activation unless force. A retired audit key
// is kept as a verifier of the checkpoints it signed.
func RotateRetire(dir string, k Kind, clk Clock, force bool) (*Bundle, error) {
	return rotate(dir, func(b *Bundle, now time.Time) error {
		p, ok := b.previous[k]
		if !ok {
			return ErrNothingToRetire
		}
		if !force && now.Before(p.since.Add(RetireAfter)) {
			return ErrTooEarly
		}
		if k == KindAuditKey {
			b.retiredAudit = append(b.retiredAudit, p.pub)
		}
		delete(b.previous, k)
		delete(b.sealed, previousName(k))
		return nil
	}, clk)
}

// rotate loads the bundle in dir under an exclusive lock, applies step,
// stamps IssuedAt and writes it back atomically.
func rotate(dir string, step func(*Bundle, time.Time) error, clk Clock) (*Bundle, error) {
	if clk == nil {
		return nil, errors.New("pki: nil clock")
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	b, err := Load(dir)
	if err != nil {
		return nil, err
	}
	now := clk.Now().UTC().Truncate(time.Second)
	if err := step(b, now); err != nil {
		return nil, err
	}
	if !now.After(b.IssuedAt) {
		now = b.IssuedAt.Add(time.Second) // trust bundles only move forward
	}
	b.IssuedAt = now
	if err := b.write(filepath.Join(dir, BundleFile), false); err != nil {
		return nil, err
	}
	return b, nil
}

// lockDir takes an exclusive flock on dir/.rotate-lock so that two
// rotations of one bundle cannot lose each other's change.
func lockDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, ".rotate-lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("pki: lock bundle: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("pki: lock bundle: %w", err)
	}
	return func() { f.Close() }, nil
}

// encodeSlots returns the on-disk form of m (nil when empty).
func encodeSlots(m map[Kind]slot) map[string]slotJSON {
	if len(m) == 0 {
		return nil
	}
	out := map[string]slotJSON{}
	for k, s := range m {
		j := slotJSON{Since: s.since.Unix()}
		if s.cert != nil {
			j.Cert = string(CertPEM(s.cert.Raw))
		} else {
			j.Key = bytes.Clone(s.pub)
		}
		out[string(k)] = j
	}
	return out
}

// decodeSlots parses and validates staged or previous slots.
func decodeSlots(in map[string]slotJSON) (map[Kind]slot, error) {
	out := map[Kind]slot{}
	for name, j := range in {
		k, err := ParseKind(name)
		if err != nil {
			return nil, err
		}
		s := slot{since: time.Unix(j.Since, 0).UTC()}
		if k.isCA() {
			if len(j.Key) != 0 {
				return nil, fmt.Errorf("pki: %s: a CA slot carries a bare key", k)
			}
			if s.cert, err = parseCACertPEM(j.Cert, k == KindCommandRoot); err != nil {
				return nil, fmt.Errorf("pki: %s: %w", k, err)
			}
		} else {
			if j.Cert != "" || len(j.Key) != ed25519.PublicKeySize {
				return nil, fmt.Errorf("pki: %s: must be a 32-byte Ed25519 key", k)
			}
			s.pub = ed25519.PublicKey(bytes.Clone(j.Key))
		}
		out[k] = s
	}
	return out, nil
}

// wantSealed lists the sealed entries a full bundle must hold: every
// active key, every staged key and the previous join key.
func (b *Bundle) wantSealed() map[string]bool {
	want := map[string]bool{}
	for _, n := range keyNames {
		want[n] = true
	}
	if b.BreakGlassCA != nil {
		want[keyBreakGlass] = true
	}
	for k := range b.staged {
		want[stagedName(k)] = true
	}
	if _, ok := b.previous[KindJoinKey]; ok {
		want[previousName(KindJoinKey)] = true
	}
	return want
}

// RotationInfo describes one staged or previous key for `pki show`.
type RotationInfo struct {
	Key   string    `json:"key"`   // kind: node-ca, internal-ca, ...
	State string    `json:"state"` // staged or previous
	Since time.Time `json:"since"` // when it entered that state
	// Serial (a CA) or Public (a bare key, base64) identifies it.
	Serial string `json:"serial,omitempty"`
	Public string `json:"public,omitempty"`
}

// rotationInfo lists the staged and previous keys in Kinds order.
func (b *Bundle) rotationInfo() []RotationInfo {
	out := []RotationInfo{}
	for _, k := range Kinds {
		for _, m := range []struct {
			state string
			slots map[Kind]slot
		}{{"staged", b.staged}, {"previous", b.previous}} {
			s, ok := m.slots[k]
			if !ok {
				continue
			}
			ri := RotationInfo{Key: string(k), State: m.state, Since: s.since}
			if s.cert != nil {
				ri.Serial = s.cert.SerialNumber.Text(16)
			} else {
				ri.Public = b64(s.pub)
			}
			out = append(out, ri)
		}
	}
	return out
}
