// Package pki is the public-key infrastructure of the Better Compute control
// plane: key and CA generation, issuance and verification of node, gateway and
// worker certificates, the signed trust bundle handed to nodes at join, and
// sealing of private keys at rest under a key-encryption key (KEK).
//
// Everything is built on the standard library and go-spiffe's spiffeid
// (the SPIFFE ID syntax). Time is always injected
// (a Clock or an explicit time.Time) so that issuance and verification are
// deterministic and testable. The package holds no mutable global state.
package pki

import (
	"crypto/x509"
	"encoding/asn1"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Roles a node certificate can carry. The role is bound into the certificate
// via the role extension (see RoleExtensionOID) so that the gateway can decide
// what a caller may do from the certificate alone.
const (
	RoleNode       = "node"
	RoleRamdisk    = "ramdisk"
	RoleSite       = "site"
	RoleNodeTenant = "node-tenant"
	// RoleBastion is a person's own machine paired with the control plane
	// (bcd bastion): it runs no command kind and gets no secret; it only
	// serves the gated lanes its signed grants allow. Only the bastions
	// module mints its pairing tokens.
	RoleBastion = "bastion"
)

// ValidRole reports whether role is one of the roles a node certificate may
// carry; anything else is refused at issuance and at verification.
func ValidRole(role string) bool {
	switch role {
	case RoleNode, RoleRamdisk, RoleSite, RoleNodeTenant, RoleBastion:
		return true
	}
	return false
}

// Clock is injected everywhere time matters, so tests and callers control
// validity windows instead of the wall clock.
type Clock interface{ Now() time.Time }

// RoleExtensionOID identifies the non-critical certificate extension whose
// value is the DER of an ASN.1 UTF8String holding the node's role. Treat it as
// read-only; the package itself uses a private copy, so mutating this value
// cannot change what the package accepts.
var RoleExtensionOID = roleOID()

func roleOID() asn1.ObjectIdentifier { return asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 59999, 1, 1} }

var idRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// ValidNodeID reports whether id is acceptable as a node ID (and, with the
// same rule, a worker ID): ^[a-z0-9][a-z0-9-]{0,62}$. IDs are embedded in
// SPIFFE URIs and certificate subjects, so the alphabet is kept small.
func ValidNodeID(id string) bool { return idRE.MatchString(id) }

// ValidateTrustDomain checks that td is a lowercase DNS-like name of 1..253
// characters from [a-z0-9.-] with no empty labels. The trust domain is the
// host of every SPIFFE ID this PKI issues.
func ValidateTrustDomain(td string) error {
	if len(td) < 1 || len(td) > 253 {
		return fmt.Errorf("pki: trust domain must be 1..253 characters, got %d", len(td))
	}
	for i := 0; i < len(td); i++ {
		c := td[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '-') {
			return fmt.Errorf("pki: trust domain %q: only [a-z0-9.-] allowed", td)
		}
	}
	for _, label := range strings.Split(td, ".") {
		if label == "" {
			return fmt.Errorf("pki: trust domain %q has an empty label", td)
		}
	}
	return nil
}

// spiffeID forms spiffe://<td>/<segments...> with go-spiffe's spiffeid,
// which checks the SPIFFE syntax. Every issuer validates td and the id
// first; for input that is not a SPIFFE ID it returns an empty URL, which
// no certificate carries and nothing accepts.
func spiffeID(td string, segments ...string) *url.URL {
	d, err := spiffeid.TrustDomainFromString(td)
	if err != nil {
		return &url.URL{}
	}
	id, err := spiffeid.FromSegments(d, segments...)
	if err != nil {
		return &url.URL{}
	}
	return id.URL()
}

// NodeSPIFFEID is the identity of a node: spiffe://<td>/node/<node-id>.
func NodeSPIFFEID(trustDomain, nodeID string) *url.URL {
	return spiffeID(trustDomain, "node", nodeID)
}

// GatewaySPIFFEID is the identity of the gateway: spiffe://<td>/gateway.
func GatewaySPIFFEID(trustDomain string) *url.URL { return spiffeID(trustDomain, "gateway") }

// WorkerSPIFFEID is the identity of a command-signing worker:
// spiffe://<td>/worker/<worker-id>.
func WorkerSPIFFEID(trustDomain, workerID string) *url.URL {
	return spiffeID(trustDomain, "worker", workerID)
}

// parseSPIFFEID splits a SPIFFE URI of the form spiffe://<td>/<kind>/<id>.
// This PKI's own rules come first, each with its named refusal: the spiffe
// scheme, the kind, a trust domain of [a-z0-9.-] and an id of ValidNodeID.
// go-spiffe's spiffeid then parses it, and it must be exactly the ID
// spiffeid forms from td, kind and id (no userinfo, port, query, fragment
// or escaping), so that string comparison of IDs is meaningful.
func parseSPIFFEID(u *url.URL, kind string) (td, id string, err error) {
	if u == nil || u.Scheme != "spiffe" {
		return "", "", errors.New("pki: URI SAN is not a spiffe ID")
	}
	rest, ok := strings.CutPrefix(u.Path, "/"+kind+"/")
	if !ok {
		return "", "", fmt.Errorf("pki: spiffe ID %q is not a %s ID", u.String(), kind)
	}
	if err := ValidateTrustDomain(u.Host); err != nil {
		return "", "", err
	}
	if !ValidNodeID(rest) {
		return "", "", fmt.Errorf("pki: spiffe ID %q has an invalid %s id", u.String(), kind)
	}
	parsed, err := spiffeid.FromURI(u)
	if err != nil || parsed.String() != spiffeID(u.Host, kind, rest).String() || parsed.String() != u.String() {
		return "", "", fmt.Errorf("pki: spiffe ID %q is not canonical", u.String())
	}
	return parsed.TrustDomain().Name(), rest, nil
}

// NodeIdentity is what a verified node certificate says about its holder.
type NodeIdentity struct {
	TrustDomain string
	NodeID      string
	Role        string
	Serial      string // lowercase hex of the certificate serial number
	NotBefore   time.Time
	NotAfter    time.Time
}

// ParseNodeCert extracts the identity from a node certificate: exactly one URI
// SAN of the form spiffe://<td>/node/<id>, and exactly one valid role
// extension. It performs no chain or time check; use VerifyNodeChain for that.
func ParseNodeCert(cert *x509.Certificate) (NodeIdentity, error) {
	if cert == nil {
		return NodeIdentity{}, errors.New("pki: nil node certificate")
	}
	if len(cert.URIs) != 1 {
		return NodeIdentity{}, fmt.Errorf("pki: node certificate must have exactly one URI SAN, has %d", len(cert.URIs))
	}
	td, id, err := parseSPIFFEID(cert.URIs[0], "node")
	if err != nil {
		return NodeIdentity{}, err
	}
	role, err := certRole(cert)
	if err != nil {
		return NodeIdentity{}, err
	}
	return NodeIdentity{
		TrustDomain: td, NodeID: id, Role: role,
		Serial:    SerialHex(cert),
		NotBefore: cert.NotBefore, NotAfter: cert.NotAfter,
	}, nil
}

func roleExtension(role string) (ext []byte, err error) {
	return asn1.MarshalWithParams(role, "utf8")
}

func certRole(cert *x509.Certificate) (string, error) {
	var role string
	found := 0
	for _, ext := range cert.Extensions {
		if !ext.Id.Equal(roleOID()) {
			continue
		}
		found++
		var rv asn1.RawValue
		rest, err := asn1.Unmarshal(ext.Value, &rv)
		if err != nil || len(rest) != 0 || rv.Class != asn1.ClassUniversal ||
			rv.Tag != asn1.TagUTF8String || rv.IsCompound || !utf8.Valid(rv.Bytes) {
			return "", errors.New("pki: malformed role extension")
		}
		role = string(rv.Bytes)
	}
	if found != 1 {
		return "", fmt.Errorf("pki: certificate must carry exactly one role extension, has %d", found)
	}
	if !ValidRole(role) {
		return "", fmt.Errorf("pki: invalid role %q", role)
	}
	return role, nil
}

// VerifyNodeChain checks chain[0] (the leaf) against roots (the node CA pool)
// for client authentication at time now, then checks that the identity is in
// trustDomain with a valid role, and returns it. Revocation is the caller's job
// (against the database). A nil roots pool is refused rather than falling back
// to the system roots.
func VerifyNodeChain(chain []*x509.Certificate, roots *x509.CertPool, trustDomain string, now time.Time) (NodeIdentity, error) {
	if len(chain) == 0 || chain[0] == nil {
		return NodeIdentity{}, errors.New("pki: empty certificate chain")
	}
	if roots == nil {
		return NodeIdentity{}, errors.New("pki: no node roots given")
	}
	if now.IsZero() {
		return NodeIdentity{}, errors.New("pki: verification time not set")
	}
	leaf := chain[0]
	if leaf.IsCA {
		return NodeIdentity{}, errors.New("pki: node certificate is a CA")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		if c != nil {
			inter.AddCert(c)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{
		Roots: roots, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return NodeIdentity{}, fmt.Errorf("pki: node certificate does not verify: %w", err)
	}
	id, err := ParseNodeCert(leaf)
	if err != nil {
		return NodeIdentity{}, err
	}
	if id.TrustDomain != trustDomain {
		return NodeIdentity{}, fmt.Errorf("pki: node certificate is for trust domain %q, want %q", id.TrustDomain, trustDomain)
	}
	return id, nil
}

// SerialHex is the one rendering of a certificate serial the registry keys
// on: lowercase hex of the serial's big-endian bytes (even length, so a
// leading zero nibble is kept).
func SerialHex(cert *x509.Certificate) string { return hex.EncodeToString(cert.SerialNumber.Bytes()) }
