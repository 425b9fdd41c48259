// Package attestation is the offline form of an attested command result:
// the exact bytes a node signed (an UpdateBody), its signature and the
// node's certificate chain, as one PEM file anyone can check with no
// server, against the node CA alone (Verify, `better-compute commands
// verify-attestation`, or openssl as docs/attestation.md shows).
//
// The signed body names the command's id, node, kind, the SHA-256 of its
// payload and its final state, so a result cannot be shown as another
// command's. The package has no server dependencies; Parse takes
// untrusted bytes and is fuzzed.
package attestation

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// The PEM block types of an attestation file, in the order they appear.
const (
	BlockBody        = "BC SIGNED UPDATE"
	BlockSignature   = "BC UPDATE SIGNATURE"
	BlockCertificate = "CERTIFICATE"
)

// SigContext prefixes the signed bytes: the node signs
// SHA-256(SigContext || body) (wire.SignNode: ECDSA, ASN.1 DER, or
// Ed25519).
const SigContext = wire.UpdateSigContext

// Bounds of a file: its size and its number of certificates.
const (
	MaxFileBytes = 1 << 20
	MaxChain     = 4
)

// Grace is how long after its certificate's expiry a node's signature
// still counts (results journaled offline), as on the control plane.
const Grace = 7 * 24 * time.Hour

// File is a parsed attestation file.
type File struct {
	// Body is the exact signed bytes (a marshalled UpdateBody).
	Body []byte
	// Signature is the node's signature over SHA-256(SigContext || Body).
	Signature []byte
	// Chain is the node certificate first, then any intermediates (the
	// node CA itself is given by whoever verifies).
	Chain []*x509.Certificate
}

// Encode renders an attestation file.
func Encode(body, sig []byte, chainDER [][]byte) []byte {
	var b bytes.Buffer
	_ = pem.Encode(&b, &pem.Block{Type: BlockBody, Bytes: body})
	_ = pem.Encode(&b, &pem.Block{Type: BlockSignature, Bytes: sig})
	for _, der := range chainDER {
		_ = pem.Encode(&b, &pem.Block{Type: BlockCertificate, Bytes: der})
	}
	return b.Bytes()
}

// Parse reads an attestation file strictly: exactly one body block, then
// one signature block, then 1 to MaxChain certificates, no PEM headers,
// nothing else but whitespace, at most MaxFileBytes.
func Parse(data []byte) (*File, error) {
	if len(data) > MaxFileBytes {
		return nil, errors.New("attestation: file larger than 1 MiB")
	}
	var f File
	rest := data
	for i := 0; ; i++ {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if len(blk.Headers) != 0 {
			return nil, fmt.Errorf("attestation: block %d has PEM headers", i+1)
		}
		switch {
		case i == 0 && blk.Type == BlockBody:
			f.Body = blk.Bytes
		case i == 1 && blk.Type == BlockSignature:
			f.Signature = blk.Bytes
		case i >= 2 && blk.Type == BlockCertificate:
			if len(f.Chain) == MaxChain {
				return nil, fmt.Errorf("attestation: more than %d certificates", MaxChain)
			}
			c, err := x509.ParseCertificate(blk.Bytes)
			if err != nil {
				return nil, fmt.Errorf("attestation: certificate %d: %w", len(f.Chain)+1, err)
			}
			f.Chain = append(f.Chain, c)
		default:
			return nil, fmt.Errorf("attestation: unexpected block %d (%.40q)", i+1, blk.Type)
		}
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.New("attestation: trailing data after the last block")
	}
	switch {
	case len(f.Body) == 0:
		return nil, errors.New("attestation: no signed update")
	case len(f.Signature) == 0:
		return nil, errors.New("attestation: no signature")
	case len(f.Chain) == 0:
		return nil, errors.New("attestation: no node certificate")
	}
	return &f, nil
}

// Result is what a verified attestation states.
type Result struct {
	CommandID     string    `json:"command_id"`
	NodeID        string    `json:"node_id"`
	Kind          string    `json:"kind"`
	PayloadSHA256 string    `json:"payload_sha256"`
	State         string    `json:"state"`
	Reason        string    `json:"reason,omitempty"`
	Result        []byte    `json:"result,omitempty"`
	SignedAt      time.Time `json:"signed_at"`
	SPIFFEID      string    `json:"spiffe_id"`
	CertSerial    string    `json:"cert_serial"`
}

// Verify checks f against roots (the node CA) with no server: the node
// certificate chains to roots for client authentication at the time the
// node signed (up to Grace after its expiry), carries a node SPIFFE ID
// (in trustDomain, when it is set) naming the node the body names, and a
// role that attests (not node-tenant); the signature verifies over the
// exact signed bytes; and the body names its command's kind and payload
// digest. Revocation is not checked: only the control plane knows it, and
// it marks a command attested only with a certificate not revoked.
func Verify(f *File, roots *x509.CertPool, trustDomain string) (Result, error) {
	if f == nil || len(f.Chain) == 0 {
		return Result{}, errors.New("attestation: nothing to verify")
	}
	if roots == nil {
		return Result{}, errors.New("attestation: no CA given")
	}
	var body nodev1.UpdateBody
	if err := proto.Unmarshal(f.Body, &body); err != nil {
		return Result{}, fmt.Errorf("attestation: signed update does not parse: %w", err)
	}
	leaf := f.Chain[0]
	signed := time.UnixMilli(body.TimeMs)
	at := signed
	if at.After(leaf.NotAfter) && !at.After(leaf.NotAfter.Add(Grace)) {
		at = leaf.NotAfter
	}
	id, err := pki.ParseNodeCert(leaf)
	if err != nil {
		return Result{}, fmt.Errorf("attestation: not a node certificate: %w", err)
	}
	td := trustDomain
	if td == "" {
		td = id.TrustDomain
	}
	if _, err := pki.VerifyNodeChain(f.Chain, roots, td, at); err != nil {
		return Result{}, fmt.Errorf("attestation: node certificate: %w", err)
	}
	if id.NodeID != body.NodeId {
		return Result{}, fmt.Errorf("attestation: the certificate is node %q's, the update names node %q", id.NodeID, body.NodeId)
	}
	if id.Role == pki.RoleNodeTenant {
		return Result{}, errors.New("attestation: a node-tenant certificate never attests")
	}
	if !wire.VerifyNode(leaf.PublicKey, SigContext, f.Body, f.Signature) {
		return Result{}, errors.New("attestation: the signature does not verify over the signed update")
	}
	if body.Kind == "" || len(body.PayloadSha256) != sha256.Size {
		return Result{}, errors.New("attestation: the signed update does not name its command's kind and payload digest")
	}
	return Result{
		CommandID: body.CommandId, NodeID: body.NodeId, Kind: body.Kind, PayloadSHA256: hex.EncodeToString(body.PayloadSha256),
		State: body.State, Reason: body.Reason, Result: body.Result, SignedAt: signed.UTC(),
		SPIFFEID: pki.NodeSPIFFEID(id.TrustDomain, id.NodeID).String(), CertSerial: id.Serial,
	}, nil
}
