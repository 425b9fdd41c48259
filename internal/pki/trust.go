package pki

import (
	"bytes"
	"crypto/ed25519"
	"crypto/subtle"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// TrustBundle is what a node pins at join: the roots it trusts for node,
// gateway (server) and command-signing certificates. It travels as the exact
// bytes of EncodeTrustBundle, signed with the join key.
type TrustBundle struct {
	Version      int      `json:"version"` // 1
	TrustDomain  string   `json:"trust_domain"`
	Deployment   string   `json:"deployment"`
	NodeRoots    [][]byte `json:"node_roots"`    // DER
	ServerRoots  [][]byte `json:"server_roots"`  // DER of internal CA: verifies the gateway's TLS cert
	CommandRoots [][]byte `json:"command_roots"` // DER
	IssuedAt     int64    `json:"issued_at"`     // unix seconds
	// Approvers are the raw 32-byte Ed25519 keys of the destructive-batch
	// approvers, held off the control plane, and Threshold is how many of
	// them must sign a batch. Both are omitted when none are pinned, so a
	// bundle signed before the quorum existed keeps its exact bytes; a node
	// with no approvers refuses every destructive command.
	Approvers [][]byte `json:"approvers,omitempty"`
	Threshold int      `json:"threshold,omitempty"`
	// JoinKeys are the raw Ed25519 join keys whose signature a node accepts
	// on a later trust bundle, listed only while a join key rotates (more
	// than one); otherwise it is the key that signed this bundle alone.
	JoinKeys [][]byte `json:"join_keys,omitempty"`
}

// Limits on untrusted trust bundles.
const (
	maxTrustBundleSize  = 256 << 10
	maxRootsPerList     = 16
	maxDeploymentLength = 253
	// MaxApprovers bounds the pinned approver keys.
	MaxApprovers       = 32
	trustBundleContext = "bc-trust-bundle-v1\x00"
)

// TrustBundle returns the trust bundle for b: every trusted root (active,
// staged, previous), stamped with b.IssuedAt, or with now for a bundle
// that predates rotation.
func (b *Bundle) TrustBundle(now time.Time) TrustBundle {
	issued := now.Unix()
	if !b.IssuedAt.IsZero() {
		issued = b.IssuedAt.Unix()
	}
	tb := TrustBundle{
		Version: 1, TrustDomain: b.TrustDomain, Deployment: b.Deployment,
		NodeRoots: rawCerts(b.NodeRoots()), ServerRoots: rawCerts(b.InternalRoots()),
		CommandRoots: rawCerts(b.CommandRoots()), IssuedAt: issued,
		Approvers: approverBytes(b.Approvers), Threshold: b.Threshold,
	}
	if keys := b.JoinKeys(); len(keys) > 1 {
		tb.JoinKeys = approverBytes(keys)
	}
	return tb
}

func rawCerts(certs []*x509.Certificate) [][]byte {
	out := make([][]byte, len(certs))
	for i, c := range certs {
		out[i] = c.Raw
	}
	return out
}

func approverBytes(keys []ed25519.PublicKey) [][]byte {
	if len(keys) == 0 {
		return nil
	}
	out := make([][]byte, len(keys))
	for i, k := range keys {
		out[i] = bytes.Clone(k)
	}
	return out
}

// validateApprovers checks a pinned approver set: none (threshold 0), or
// 1..MaxApprovers distinct 32-byte Ed25519 keys with 1 <= threshold <= count.
func validateApprovers(keys [][]byte, threshold int) error {
	if len(keys) == 0 {
		if threshold != 0 {
			return errors.New("pki: approver threshold without approvers")
		}
		return nil
	}
	if len(keys) > MaxApprovers {
		return fmt.Errorf("pki: at most %d approvers", MaxApprovers)
	}
	seen := map[string]bool{}
	for _, k := range keys {
		if len(k) != ed25519.PublicKeySize {
			return errors.New("pki: approver key is not a 32-byte Ed25519 key")
		}
		if seen[string(k)] {
			return errors.New("pki: approver key listed twice")
		}
		seen[string(k)] = true
	}
	if threshold < 1 || threshold > len(keys) {
		return fmt.Errorf("pki: approver threshold must be 1..%d", len(keys))
	}
	return nil
}

func (tb TrustBundle) validate() error {
	if tb.Version != 1 {
		return fmt.Errorf("pki: trust bundle version %d unsupported", tb.Version)
	}
	if err := ValidateTrustDomain(tb.TrustDomain); err != nil {
		return fmt.Errorf("pki: trust bundle: %w", err)
	}
	if tb.Deployment == "" || len(tb.Deployment) > maxDeploymentLength {
		return errors.New("pki: trust bundle deployment must be 1..253 bytes")
	}
	if tb.IssuedAt < 0 {
		return errors.New("pki: trust bundle issued_at is negative")
	}
	for _, l := range []struct {
		name  string
		roots [][]byte
	}{{"node_roots", tb.NodeRoots}, {"server_roots", tb.ServerRoots}, {"command_roots", tb.CommandRoots}} {
		if len(l.roots) == 0 || len(l.roots) > maxRootsPerList {
			return fmt.Errorf("pki: trust bundle %s must hold 1..%d roots", l.name, maxRootsPerList)
		}
		for _, der := range l.roots {
			if _, err := parseRoot(der); err != nil {
				return fmt.Errorf("pki: trust bundle %s: %w", l.name, err)
			}
		}
	}
	if err := validateApprovers(tb.Approvers, tb.Threshold); err != nil {
		return fmt.Errorf("pki: trust bundle: %w", err)
	}
	if len(tb.JoinKeys) == 1 || len(tb.JoinKeys) > maxRootsPerList {
		return fmt.Errorf("pki: trust bundle join_keys must hold 2..%d keys when present", maxRootsPerList)
	}
	seen := map[string]bool{}
	for _, k := range tb.JoinKeys {
		if len(k) != ed25519.PublicKeySize || seen[string(k)] {
			return errors.New("pki: trust bundle join key is not a distinct 32-byte Ed25519 key")
		}
		seen[string(k)] = true
	}
	return nil
}

func parseRoot(der []byte) (*x509.Certificate, error) {
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	if !c.BasicConstraintsValid || !c.IsCA {
		return nil, errors.New("root is not a CA certificate")
	}
	return c, nil
}

// EncodeTrustBundle encodes tb deterministically (fields in declaration
// order, certificates as base64 DER, no whitespace) after validating it.
func EncodeTrustBundle(tb TrustBundle) ([]byte, error) {
	if err := tb.validate(); err != nil {
		return nil, err
	}
	out, err := json.Marshal(tb)
	if err != nil {
		return nil, fmt.Errorf("pki: encode trust bundle: %w", err)
	}
	return out, nil
}

// DecodeTrustBundle parses untrusted bytes strictly: unknown fields, trailing
// data, a missing or invalid trust domain, empty root lists, roots that are
// not CA certificates, and any encoding other than the exact canonical one
// produced by EncodeTrustBundle are errors.
func DecodeTrustBundle(data []byte) (TrustBundle, error) {
	if len(data) > maxTrustBundleSize {
		return TrustBundle{}, errors.New("pki: trust bundle too large")
	}
	var tb TrustBundle
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&tb); err != nil {
		return TrustBundle{}, fmt.Errorf("pki: decode trust bundle: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return TrustBundle{}, errors.New("pki: trailing data after trust bundle")
	}
	if err := tb.validate(); err != nil {
		return TrustBundle{}, err
	}
	// Reject anything but the canonical form (duplicate or case-folded keys,
	// whitespace, non-canonical base64), so one signed body has one meaning.
	canon, err := json.Marshal(tb)
	if err != nil || !bytes.Equal(canon, data) {
		return TrustBundle{}, errors.New("pki: trust bundle is not canonically encoded")
	}
	return tb, nil
}

// SignTrustBundle signs the exact encoded bytes with the join key:
// ed25519.Sign(key, "bc-trust-bundle-v1\x00" || body).
func SignTrustBundle(key ed25519.PrivateKey, body []byte) []byte {
	return ed25519.Sign(key, append([]byte(trustBundleContext), body...))
}

// VerifyTrustBundle checks that joinPub matches pin (from the join token),
// that sig is its signature over body, and then decodes body.
func VerifyTrustBundle(body, sig []byte, joinPub ed25519.PublicKey, pin [32]byte) (TrustBundle, error) {
	if len(joinPub) != ed25519.PublicKeySize {
		return TrustBundle{}, errors.New("pki: join key is not an Ed25519 public key")
	}
	got := JoinKeyPin(joinPub)
	if subtle.ConstantTimeCompare(got[:], pin[:]) != 1 {
		return TrustBundle{}, errors.New("pki: join key does not match the pin")
	}
	if !ed25519.Verify(joinPub, append([]byte(trustBundleContext), body...), sig) {
		return TrustBundle{}, errors.New("pki: trust bundle signature does not verify")
	}
	return DecodeTrustBundle(body)
}

func certPool(ders [][]byte) (*x509.CertPool, error) {
	if len(ders) == 0 {
		return nil, errors.New("pki: no roots")
	}
	pool := x509.NewCertPool()
	for _, der := range ders {
		c, err := parseRoot(der)
		if err != nil {
			return nil, fmt.Errorf("pki: parse root: %w", err)
		}
		pool.AddCert(c)
	}
	return pool, nil
}

// NodeRootPool returns the node CAs as a pool for VerifyNodeChain.
func (tb TrustBundle) NodeRootPool() (*x509.CertPool, error) { return certPool(tb.NodeRoots) }

// ServerRootPool returns the internal CAs as a pool for verifying the gateway's TLS certificate.
func (tb TrustBundle) ServerRootPool() (*x509.CertPool, error) { return certPool(tb.ServerRoots) }

// CommandRootCerts returns the parsed command roots for VerifyWorkerChain.
func (tb TrustBundle) CommandRootCerts() ([]*x509.Certificate, error) {
	if len(tb.CommandRoots) == 0 {
		return nil, errors.New("pki: no command roots")
	}
	out := make([]*x509.Certificate, 0, len(tb.CommandRoots))
	for _, der := range tb.CommandRoots {
		c, err := parseRoot(der)
		if err != nil {
			return nil, fmt.Errorf("pki: parse command root: %w", err)
		}
		if _, ok := c.PublicKey.(ed25519.PublicKey); !ok {
			return nil, errors.New("pki: command root is not Ed25519")
		}
		out = append(out, c)
	}
	return out, nil
}

// JoinSignature is one join key's signature over a trust bundle body
// (SignTrustBundle). While the join key rotates, the control plane signs
// each bundle with every join key it holds, so a node or a token pinning
// any of them finds a signature it can check.
type JoinSignature struct {
	Key ed25519.PublicKey
	Sig []byte
}

// VerifyTrustBundleAny verifies body with the first signature in sigs
// whose key's pin is one of pins, then decodes it. It returns the bundle
// and the signature that verified it (its key and bytes).
func VerifyTrustBundleAny(body []byte, sigs []JoinSignature, pins [][32]byte) (TrustBundle, JoinSignature, error) {
	for _, s := range sigs {
		if len(s.Key) != ed25519.PublicKeySize {
			continue
		}
		got := JoinKeyPin(s.Key)
		for _, pin := range pins {
			if subtle.ConstantTimeCompare(got[:], pin[:]) == 1 {
				tb, err := VerifyTrustBundle(body, s.Sig, s.Key, pin)
				return tb, s, err
			}
		}
	}
	return TrustBundle{}, JoinSignature{}, errors.New("pki: no signature by a pinned join key")
}

// Pins returns the pins of the join keys whose signature a node holding tb,
// which signer's key verified, accepts on a later bundle: tb's JoinKeys
// while the join key rotates, else signer's alone.
func (tb TrustBundle) Pins(signer ed25519.PublicKey) [][32]byte {
	if len(tb.JoinKeys) == 0 {
		return [][32]byte{JoinKeyPin(signer)}
	}
	out := make([][32]byte, len(tb.JoinKeys))
	for i, k := range tb.JoinKeys {
		out[i] = JoinKeyPin(k)
	}
	return out
}

// Refresh outcomes other than acceptance.
var (
	// ErrBundleNotNewer: the offered bundle is not newer than the pinned one
	// (the same or a replayed older one): keep the pinned bundle.
	ErrBundleNotNewer = errors.New("pki: offered trust bundle is not newer than the pinned one")
	// ErrBundleChangesPins: the offered bundle changes what a refresh may
	// never change: trust domain, deployment, approvers or threshold. The
	// approvers change only under their own quorum's signatures.
	ErrBundleChangesPins = errors.New("pki: offered trust bundle changes the trust domain, deployment or approvers")
)

// CheckRefresh decides whether a node pinning cur may replace it with
// next, a bundle already verified by a pinned join key: only a strictly
// newer bundle for the same trust domain, deployment and approver set.
func CheckRefresh(cur, next TrustBundle) error {
	if next.TrustDomain != cur.TrustDomain || next.Deployment != cur.Deployment || next.Threshold != cur.Threshold ||
		len(next.Approvers) != len(cur.Approvers) {
		return ErrBundleChangesPins
	}
	for i := range cur.Approvers {
		if !bytes.Equal(cur.Approvers[i], next.Approvers[i]) {
			return ErrBundleChangesPins
		}
	}
	if next.IssuedAt <= cur.IssuedAt {
		return ErrBundleNotNewer
	}
	return nil
}
