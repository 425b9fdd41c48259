package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
)

// BundleFile is the name of the bundle inside its directory.
const BundleFile = "bundle.json"

// Names of the sealed keys; each is sealed with aad "bc-pki/<name>" so that a
// sealed blob cannot be moved to another slot.
const (
	keyNodeCA      = "node-ca"
	keyInternalCA  = "internal-ca"
	keyCommandRoot = "command-root"
	keyJoin        = "join-key"
	keyAudit       = "audit-key"
	// keyBreakGlass is the break-glass SSH CA (package sshca signs with
	// it). It is optional in a loaded bundle: a deployment made before it
	// existed gets one from EnsureBreakGlassCA.
	keyBreakGlass = "break-glass-ssh-ca"
)

var keyNames = [...]string{keyNodeCA, keyInternalCA, keyCommandRoot, keyJoin, keyAudit}

const maxBundleFile = 1 << 20

// Bundle is the control plane's PKI as stored in DIR/bundle.json (mode 0600):
// public certificates and keys in the clear, private keys only sealed under
// the KEK. Obtain one with Init or Load; unseal a key only when about to use it.
type Bundle struct {
	TrustDomain string            // e.g. "dev.bc.local"
	Deployment  string            // deployment name, default = TrustDomain
	NodeCA      *x509.Certificate // ECDSA P-256 self-signed CA, 10y; issues node client certs
	InternalCA  *x509.Certificate // ECDSA P-256 self-signed CA, 10y; issues the gateway's TLS cert
	CommandRoot *x509.Certificate // Ed25519 self-signed CA, 10y; certifies 24h worker keys
	JoinKey     ed25519.PublicKey // signs trust bundles handed to nodes at join
	AuditKey    ed25519.PublicKey // signs audit checkpoints
	// BreakGlassCA is the break-glass SSH certificate authority's public
	// key (an OpenSSH user CA; nil in a bundle made before it existed,
	// until EnsureBreakGlassCA adds it). It is never a node, command or
	// sandbox key.
	BreakGlassCA ed25519.PublicKey
	// Approvers are the destructive-batch approvers' public keys (their
	// private halves never reach the control plane) and Threshold how many
	// must sign a batch; pinned into the trust bundle by PinApprovers.
	Approvers []ed25519.PublicKey
	Threshold int
	// IssuedAt is when the trust content last changed (init or a rotation
	// step); trust bundles carry it so a node takes only a newer one. Zero
	// for a bundle written before rotation existed: TrustBundle then stamps
	// the time it is asked.
	IssuedAt time.Time

	sealed       map[string][]byte // key name -> Seal output of its PKCS#8 DER
	staged       map[Kind]slot     // keys made by RotateStage, trusted, not used
	previous     map[Kind]slot     // keys replaced by RotateActivate, still trusted
	retiredAudit []ed25519.PublicKey
}

// bundleJSON is the on-disk form of a Bundle.
type bundleJSON struct {
	Version     int    `json:"version"`
	TrustDomain string `json:"trust_domain"`
	Deployment  string `json:"deployment"`
	NodeCA      string `json:"node_ca"`      // PEM
	InternalCA  string `json:"internal_ca"`  // PEM
	CommandRoot string `json:"command_root"` // PEM
	JoinKey     []byte `json:"join_key"`
	AuditKey    []byte `json:"audit_key"`
	// BreakGlassCA is omitted in bundles made before it existed.
	BreakGlassCA []byte            `json:"break_glass_ssh_ca,omitempty"`
	Approvers    [][]byte          `json:"approvers,omitempty"`
	Threshold    int               `json:"threshold,omitempty"`
	Sealed       map[string][]byte `json:"sealed"`
	// Rotation state (rotate.go); all omitted before the first rotation.
	IssuedAt         int64               `json:"issued_at,omitempty"`
	Staged           map[string]slotJSON `json:"staged,omitempty"`
	Previous         map[string]slotJSON `json:"previous,omitempty"`
	RetiredAuditKeys [][]byte            `json:"retired_audit_keys,omitempty"`
}

// Init makes a fresh bundle in dir (created 0700 if missing), refusing if
// dir/bundle.json exists. All private keys are sealed under kek before
// anything is written; clk supplies the CA validity start.
func Init(dir, trustDomain string, kek KEK, clk Clock) (*Bundle, error) {
	if err := ValidateTrustDomain(trustDomain); err != nil {
		return nil, err
	}
	if clk == nil {
		return nil, errors.New("pki: nil clock")
	}
	if kek == (KEK{}) {
		return nil, errors.New("pki: refusing an all-zero KEK")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pki: create bundle dir: %w", err)
	}
	path := filepath.Join(dir, BundleFile)
	if _, err := os.Lstat(path); err == nil {
		return nil, fmt.Errorf("pki: %s already exists: %w", path, fs.ErrExist)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("pki: %w", err)
	}
	now := clk.Now()
	b := &Bundle{TrustDomain: trustDomain, Deployment: trustDomain, IssuedAt: now.UTC().Truncate(time.Second),
		sealed: map[string][]byte{}, staged: map[Kind]slot{}, previous: map[Kind]slot{}}
	var err error
	newP256 := func() (crypto.Signer, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }
	newEd := func() (crypto.Signer, error) { _, k, err := ed25519.GenerateKey(rand.Reader); return k, err }
	if b.NodeCA, err = b.newCA(kek, keyNodeCA, "Better Compute node CA", newP256, now); err != nil {
		return nil, err
	}
	if b.InternalCA, err = b.newCA(kek, keyInternalCA, "Better Compute internal CA", newP256, now); err != nil {
		return nil, err
	}
	if b.CommandRoot, err = b.newCA(kek, keyCommandRoot, "Better Compute command root", newEd, now); err != nil {
		return nil, err
	}
	for _, name := range []string{keyJoin, keyAudit, keyBreakGlass} {
		k, err := newEd()
		if err != nil {
			return nil, fmt.Errorf("pki: generate %s: %w", name, err)
		}
		if err := b.seal(kek, name, k); err != nil {
			return nil, err
		}
		switch name {
		case keyJoin:
			b.JoinKey = k.Public().(ed25519.PublicKey)
		case keyAudit:
			b.AuditKey = k.Public().(ed25519.PublicKey)
		default:
			b.BreakGlassCA = k.Public().(ed25519.PublicKey)
		}
	}
	if err := b.write(path, true); err != nil {
		return nil, err
	}
	return b, nil
}

// write stores b at path (0600, atomically; exclusive refuses an existing file).
func (b *Bundle) write(path string, exclusive bool) error {
	data, err := json.MarshalIndent(bundleJSON{
		Version: 1, TrustDomain: b.TrustDomain, Deployment: b.Deployment,
		NodeCA: string(CertPEM(b.NodeCA.Raw)), InternalCA: string(CertPEM(b.InternalCA.Raw)),
		CommandRoot: string(CertPEM(b.CommandRoot.Raw)),
		JoinKey:     b.JoinKey, AuditKey: b.AuditKey, BreakGlassCA: b.BreakGlassCA,
		Approvers: approverBytes(b.Approvers), Threshold: b.Threshold,
		Sealed: b.sealed, Staged: encodeSlots(b.staged), Previous: encodeSlots(b.previous),
		RetiredAuditKeys: approverBytes(b.retiredAudit), IssuedAt: unixOrZero(b.IssuedAt),
	}, "", "  ")
	if err != nil {
		return fmt.Errorf("pki: encode bundle: %w", err)
	}
	return writeFileAtomic(path, append(data, '\n'), 0o600, exclusive)
}

// ErrApproversPinned is returned by PinApprovers for a bundle that already
// pins approvers: replacing them needs the current approvers' signatures
// (batch sign-approvers), never a rewrite of the bundle.
var ErrApproversPinned = errors.New("pki: the bundle already pins approvers")

// PinApprovers pins the destructive-batch approvers' public keys and the
// threshold into the bundle in dir, for a fresh deployment before nodes
// join (a node pins the trust bundle once, at join). It refuses a bundle
// that already pins approvers (ErrApproversPinned) and an invalid set.
func PinApprovers(dir string, keys []ed25519.PublicKey, threshold int) (*Bundle, error) {
	b, err := Load(dir)
	if err != nil {
		return nil, err
	}
	if len(b.Approvers) > 0 {
		return nil, ErrApproversPinned
	}
	if len(keys) == 0 {
		return nil, errors.New("pki: no approver keys to pin")
	}
	if err := validateApprovers(approverBytes(keys), threshold); err != nil {
		return nil, err
	}
	b.Approvers = make([]ed25519.PublicKey, len(keys))
	for i, k := range keys {
		b.Approvers[i] = bytes.Clone(k)
	}
	b.Threshold = threshold
	if err := b.write(filepath.Join(dir, BundleFile), false); err != nil {
		return nil, err
	}
	return b, nil
}

// newCA generates a key, seals it under name and returns a self-signed CA
// certificate for it valid for 10 years, allowing no intermediates.
func (b *Bundle) newCA(kek KEK, name, cn string, gen func() (crypto.Signer, error), now time.Time) (*x509.Certificate, error) {
	key, err := gen()
	if err != nil {
		return nil, fmt.Errorf("pki: generate %s: %w", name, err)
	}
	if err := b.seal(kek, name, key); err != nil {
		return nil, err
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: cn, Organization: []string{b.Deployment}, OrganizationalUnit: []string{b.TrustDomain}},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("pki: self-sign %s: %w", name, err)
	}
	return x509.ParseCertificate(der)
}

func (b *Bundle) seal(kek KEK, name string, key crypto.Signer) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("pki: marshal %s: %w", name, err)
	}
	defer clear(der)
	s, err := Seal(kek, der, []byte("bc-pki/"+name))
	if err != nil {
		return err
	}
	b.sealed[name] = s
	return nil
}

// Load reads dir/bundle.json. Public parts are parsed and validated; sealed
// keys stay sealed until one of the key methods is called with the KEK.
func Load(dir string) (*Bundle, error) { return load(dir, false) }

// load reads dir/bundle.json; public accepts a bundle without any sealed
// key (the public half).
func load(dir string, public bool) (*Bundle, error) {
	path := filepath.Join(dir, BundleFile)
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("pki: load bundle: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxBundleFile+1))
	if err != nil {
		return nil, fmt.Errorf("pki: read %s: %w", path, err)
	}
	if len(data) > maxBundleFile {
		return nil, fmt.Errorf("pki: %s is too large", path)
	}
	var bj bundleJSON
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&bj); err != nil {
		return nil, fmt.Errorf("pki: decode %s: %w", path, err)
	}
	if bj.Version != 1 {
		return nil, fmt.Errorf("pki: %s: unsupported version %d", path, bj.Version)
	}
	if err := ValidateTrustDomain(bj.TrustDomain); err != nil {
		return nil, err
	}
	b := &Bundle{TrustDomain: bj.TrustDomain, Deployment: bj.Deployment, sealed: bj.Sealed}
	if b.Deployment == "" {
		b.Deployment = b.TrustDomain
	}
	for _, c := range []struct {
		dst  **x509.Certificate
		pem  string
		name string
		ed   bool
	}{{&b.NodeCA, bj.NodeCA, keyNodeCA, false}, {&b.InternalCA, bj.InternalCA, keyInternalCA, false}, {&b.CommandRoot, bj.CommandRoot, keyCommandRoot, true}} {
		if *c.dst, err = parseCACertPEM(c.pem, c.ed); err != nil {
			return nil, fmt.Errorf("pki: %s: %s: %w", path, c.name, err)
		}
	}
	if len(bj.JoinKey) != ed25519.PublicKeySize || len(bj.AuditKey) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("pki: %s: join and audit keys must be 32-byte Ed25519 keys", path)
	}
	b.JoinKey, b.AuditKey = bj.JoinKey, bj.AuditKey
	if bj.BreakGlassCA != nil {
		if len(bj.BreakGlassCA) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("pki: %s: the break-glass SSH CA must be a 32-byte Ed25519 key", path)
		}
		b.BreakGlassCA = bj.BreakGlassCA
	}
	if err := validateApprovers(bj.Approvers, bj.Threshold); err != nil {
		return nil, fmt.Errorf("pki: %s: %w", path, err)
	}
	for _, k := range bj.Approvers {
		b.Approvers = append(b.Approvers, ed25519.PublicKey(k))
	}
	b.Threshold = bj.Threshold
	if err := b.loadRotation(bj); err != nil {
		return nil, fmt.Errorf("pki: %s: %w", path, err)
	}
	if public && len(b.sealed) == 0 {
		return b, nil
	}
	want := b.wantSealed()
	for name := range want {
		if len(b.sealed[name]) == 0 {
			return nil, fmt.Errorf("pki: %s: sealed %s missing", path, name)
		}
	}
	if len(b.sealed) != len(want) {
		return nil, fmt.Errorf("pki: %s: unexpected sealed entries", path)
	}
	return b, nil
}

// loadRotation fills b's rotation state from bj.
func (b *Bundle) loadRotation(bj bundleJSON) error {
	var err error
	if b.staged, err = decodeSlots(bj.Staged); err != nil {
		return err
	}
	if b.previous, err = decodeSlots(bj.Previous); err != nil {
		return err
	}
	for _, k := range bj.RetiredAuditKeys {
		if len(k) != ed25519.PublicKeySize {
			return errors.New("retired audit keys must be 32-byte Ed25519 keys")
		}
		b.retiredAudit = append(b.retiredAudit, ed25519.PublicKey(k))
	}
	if bj.IssuedAt < 0 {
		return errors.New("issued_at is negative")
	}
	if bj.IssuedAt > 0 {
		b.IssuedAt = time.Unix(bj.IssuedAt, 0).UTC()
	}
	if b.sealed == nil {
		b.sealed = map[string][]byte{}
	}
	return nil
}

func unixOrZero(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.Unix()
}

func b64(k []byte) string { return base64.StdEncoding.EncodeToString(k) }

func parseCACertPEM(s string, wantEd25519 bool) (*x509.Certificate, error) {
	block, rest := pem.Decode([]byte(s))
	if block == nil || block.Type != "CERTIFICATE" || len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.New("expected exactly one CERTIFICATE PEM block")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, err
	}
	if !cert.BasicConstraintsValid || !cert.IsCA {
		return nil, errors.New("certificate is not a CA")
	}
	switch k := cert.PublicKey.(type) {
	case ed25519.PublicKey:
		if wantEd25519 {
			return cert, nil
		}
	case *ecdsa.PublicKey:
		if !wantEd25519 && k.Curve == elliptic.P256() {
			return cert, nil
		}
	}
	return nil, errors.New("CA has the wrong key type")
}

// unseal opens the sealed key name and checks that it belongs to pub, so a
// sealed blob swapped in from another bundle under the same KEK is refused.
func (b *Bundle) unseal(kek KEK, name string, pub crypto.PublicKey) (crypto.Signer, error) {
	der, err := Open(kek, b.sealed[name], []byte("bc-pki/"+name))
	if err != nil {
		return nil, fmt.Errorf("pki: unseal %s: %w", name, err)
	}
	defer clear(der)
	key, err := x509.ParsePKCS8PrivateKey(der)
	signer, ok := key.(crypto.Signer)
	if err != nil || !ok {
		return nil, fmt.Errorf("pki: unseal %s: not a private key: %w", name, ErrSealBroken)
	}
	if p, ok := signer.Public().(interface{ Equal(crypto.PublicKey) bool }); !ok || !p.Equal(pub) {
		return nil, fmt.Errorf("pki: unseal %s: key does not match its public half: %w", name, ErrSealBroken)
	}
	return signer, nil
}

// unsealAs unseals name and checks its type; pub is the expected public half.
func unsealAs[T crypto.Signer](b *Bundle, kek KEK, name string, pub crypto.PublicKey) (T, error) {
	var zero T
	if pub == nil {
		return zero, fmt.Errorf("pki: bundle has no public half for %s", name)
	}
	k, err := b.unseal(kek, name, pub)
	if err != nil {
		return zero, err
	}
	t, ok := k.(T)
	if !ok {
		return zero, fmt.Errorf("pki: unseal %s: wrong key type: %w", name, ErrSealBroken)
	}
	return t, nil
}

func certPub(c *x509.Certificate) crypto.PublicKey {
	if c == nil {
		return nil
	}
	return c.PublicKey
}

// NodeCAKey unseals the node CA's private key with kek.
func (b *Bundle) NodeCAKey(kek KEK) (*ecdsa.PrivateKey, error) {
	return unsealAs[*ecdsa.PrivateKey](b, kek, keyNodeCA, certPub(b.NodeCA))
}

// InternalCAKey unseals the internal CA's private key with kek.
func (b *Bundle) InternalCAKey(kek KEK) (*ecdsa.PrivateKey, error) {
	return unsealAs[*ecdsa.PrivateKey](b, kek, keyInternalCA, certPub(b.InternalCA))
}

// CommandRootKey unseals the command root's private key with kek.
func (b *Bundle) CommandRootKey(kek KEK) (ed25519.PrivateKey, error) {
	return unsealAs[ed25519.PrivateKey](b, kek, keyCommandRoot, certPub(b.CommandRoot))
}

// JoinSigningKey unseals the join key, which signs trust bundles, with kek.
func (b *Bundle) JoinSigningKey(kek KEK) (ed25519.PrivateKey, error) {
	return unsealAs[ed25519.PrivateKey](b, kek, keyJoin, b.JoinKey)
}

// AuditSigningKey unseals the audit key, which signs audit checkpoints, with kek.
func (b *Bundle) AuditSigningKey(kek KEK) (ed25519.PrivateKey, error) {
	return unsealAs[ed25519.PrivateKey](b, kek, keyAudit, b.AuditKey)
}

// BreakGlassCAKey unseals the break-glass SSH CA's private key with kek;
// a bundle without one (made before it existed) is refused: run
// EnsureBreakGlassCA first.
func (b *Bundle) BreakGlassCAKey(kek KEK) (ed25519.PrivateKey, error) {
	if b.BreakGlassCA == nil {
		return nil, errors.New("pki: the bundle has no break-glass SSH CA")
	}
	return unsealAs[ed25519.PrivateKey](b, kek, keyBreakGlass, b.BreakGlassCA)
}

// EnsureBreakGlassCA loads the bundle in dir and, when it has no
// break-glass SSH CA (a deployment made before there was one), makes one:
// an Ed25519 key sealed under kek like the other keys, its public half in
// the bundle, written atomically. It returns the bundle and whether it
// added the key. The key-encryption key must open the bundle's node CA
// first, so a wrong KEK never seals a key no one can open.
func EnsureBreakGlassCA(dir string, kek KEK) (*Bundle, bool, error) {
	b, err := Load(dir)
	if err != nil {
		return nil, false, err
	}
	if b.BreakGlassCA != nil {
		return b, false, nil
	}
	if _, err := b.NodeCAKey(kek); err != nil {
		return nil, false, err
	}
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, false, fmt.Errorf("pki: generate %s: %w", keyBreakGlass, err)
	}
	if err := b.seal(kek, keyBreakGlass, k); err != nil {
		return nil, false, err
	}
	b.BreakGlassCA = k.Public().(ed25519.PublicKey)
	if err := b.write(filepath.Join(dir, BundleFile), false); err != nil {
		return nil, false, err
	}
	return b, true, nil
}

// JoinKeyPin is the pin a node is given with its join token: SHA-256 of the
// raw 32-byte Ed25519 join public key.
func JoinKeyPin(pub ed25519.PublicKey) [32]byte { return sha256.Sum256(pub) }

// CertInfo describes one certificate for display.
type CertInfo struct {
	Subject  string    `json:"subject"`
	Serial   string    `json:"serial"` // lowercase hex
	NotAfter time.Time `json:"not_after"`
	SHA256   string    `json:"sha256_fingerprint"` // lowercase hex SHA-256 of the DER
	SPKIPin  string    `json:"spki_pin"`           // base64 SHA-256 of the SubjectPublicKeyInfo
	PEM      string    `json:"pem"`
}

// ShowInfo is the public material of a Bundle, printed by `pki show`. It is
// built only from public fields and can never carry private key material.
type ShowInfo struct {
	TrustDomain string   `json:"trust_domain"`
	Deployment  string   `json:"deployment"`
	NodeCA      CertInfo `json:"node_ca"`
	InternalCA  CertInfo `json:"internal_ca"`
	CommandRoot CertInfo `json:"command_root"`
	JoinKey     string   `json:"join_key"`     // base64
	JoinKeyPin  string   `json:"join_key_pin"` // lowercase hex of JoinKeyPin
	AuditKey    string   `json:"audit_key"`    // base64
	// BreakGlassCA is the break-glass SSH CA as an authorized_keys line
	// ("" when the bundle has none yet).
	BreakGlassCA string   `json:"break_glass_ssh_ca"`
	Approvers    []string `json:"approvers"` // base64 Ed25519 keys of the destructive-batch approvers
	Threshold    int      `json:"threshold"` // approvals a destructive batch needs
	// IssuedAt is when the trust content last changed (zero before the
	// first rotation of a bundle made by an older version).
	IssuedAt time.Time `json:"issued_at"`
	// Rotation lists staged and previous keys; RetiredAuditKeys the audit
	// keys kept to verify old checkpoints (base64).
	Rotation         []RotationInfo `json:"rotation"`
	RetiredAuditKeys []string       `json:"retired_audit_keys"`
}

func certInfo(c *x509.Certificate) CertInfo {
	fp := sha256.Sum256(c.Raw)
	pin := sha256.Sum256(c.RawSubjectPublicKeyInfo)
	return CertInfo{
		Subject: c.Subject.String(), Serial: c.SerialNumber.Text(16), NotAfter: c.NotAfter.UTC(),
		SHA256: hex.EncodeToString(fp[:]), SPKIPin: base64.StdEncoding.EncodeToString(pin[:]),
		PEM: string(CertPEM(c.Raw)),
	}
}

// Show returns the bundle's public material for display.
func (b *Bundle) Show() ShowInfo {
	pin := JoinKeyPin(b.JoinKey)
	return ShowInfo{
		TrustDomain: b.TrustDomain, Deployment: b.Deployment,
		NodeCA: certInfo(b.NodeCA), InternalCA: certInfo(b.InternalCA), CommandRoot: certInfo(b.CommandRoot),
		JoinKey:      base64.StdEncoding.EncodeToString(b.JoinKey),
		JoinKeyPin:   hex.EncodeToString(pin[:]),
		AuditKey:     base64.StdEncoding.EncodeToString(b.AuditKey),
		BreakGlassCA: b.breakGlassLine(),
		Approvers:    approverStrings(b.Approvers), Threshold: b.Threshold,
		IssuedAt: b.IssuedAt, Rotation: b.rotationInfo(), RetiredAuditKeys: approverStrings(b.retiredAudit),
	}
}

func approverStrings(keys []ed25519.PublicKey) []string {
	out := []string{}
	for _, k := range keys {
		out = append(out, base64.StdEncoding.EncodeToString(k))
	}
	return out
}

// String renders s for humans, as `pki show` prints it.
func (s ShowInfo) String() string {
	var w strings.Builder
	fmt.Fprintf(&w, "trust domain: %s\ndeployment:   %s\n", s.TrustDomain, s.Deployment)
	for _, c := range []struct {
		name string
		ci   CertInfo
	}{{"node CA", s.NodeCA}, {"internal CA", s.InternalCA}, {"command root", s.CommandRoot}} {
		fmt.Fprintf(&w, "\n%s:\n  subject:   %s\n  serial:    %s\n  not after: %s\n  sha256:    %s\n  spki pin:  %s\n%s",
			c.name, c.ci.Subject, c.ci.Serial, c.ci.NotAfter.Format(time.RFC3339), c.ci.SHA256, c.ci.SPKIPin, c.ci.PEM)
	}
	fmt.Fprintf(&w, "\njoin key:     %s\njoin key pin: %s\naudit key:    %s\n", s.JoinKey, s.JoinKeyPin, s.AuditKey)
	if s.BreakGlassCA != "" {
		fmt.Fprintf(&w, "break-glass SSH CA: %s\n", s.BreakGlassCA)
	}
	if len(s.Approvers) == 0 {
		fmt.Fprintf(&w, "approvers:    none pinned (destructive commands are refused)\n")
	} else {
		fmt.Fprintf(&w, "approvers:    %d of %d must sign a destructive batch\n", s.Threshold, len(s.Approvers))
		for _, k := range s.Approvers {
			fmt.Fprintf(&w, "  %s\n", k)
		}
	}
	if len(s.Rotation) == 0 {
		fmt.Fprintf(&w, "rotation:     none in progress\n")
	}
	for _, r := range s.Rotation {
		id := r.Serial
		if id == "" {
			id = r.Public
		}
		fmt.Fprintf(&w, "rotation:     %s %s since %s (%s)\n", r.Key, r.State, r.Since.Format(time.RFC3339), id)
	}
	for _, k := range s.RetiredAuditKeys {
		fmt.Fprintf(&w, "retired audit key: %s\n", k)
	}
	return w.String()
}

// breakGlassLine is the break-glass SSH CA as an authorized_keys line, or
// "" when the bundle has none.
func (b *Bundle) breakGlassLine() string {
	if b.BreakGlassCA == nil {
		return ""
	}
	pub, err := ssh.NewPublicKey(b.BreakGlassCA)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub)))
}
