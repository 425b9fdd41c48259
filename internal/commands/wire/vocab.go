package wire

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
)

// State is a command's state, as the control plane stores it, bcd signs it
// in updates and the API shows it. One type, so no package spells the
// states as string literals of its own.
type State string

// The command states. Queued, sent and running are live; the rest are
// terminal.
const (
	StateQueued    State = "queued"
	StateSent      State = "sent"
	StateRunning   State = "running"
	StateSucceeded State = "succeeded"
	StateFailed    State = "failed"
	StateCancelled State = "cancelled"
)

// LiveStates are the states of a command that has not finished, in the
// order a command passes through them.
var LiveStates = []State{StateQueued, StateSent, StateRunning}

// Terminal reports whether s is a final state: nothing moves a command out
// of it.
func (s State) Terminal() bool {
	return s == StateSucceeded || s == StateFailed || s == StateCancelled
}

// Valid reports whether s is one of the six states.
func (s State) Valid() bool {
	switch s {
	case StateQueued, StateSent, StateRunning, StateSucceeded, StateFailed, StateCancelled:
		return true
	}
	return false
}

// nodeDigest is what a node key signs for a statement under sigContext:
// SHA-256(sigContext || body). The context keeps one kind of statement's
// signature from passing as another's.
func nodeDigest(sigContext string, body []byte) [32]byte {
	h := sha256.New()
	h.Write([]byte(sigContext))
	h.Write(body)
	var d [32]byte
	h.Sum(d[:0])
	return d
}

// SignNode signs body under sigContext with a node key: ECDSA (ASN.1) or
// Ed25519 over SHA-256(sigContext || body). Every statement bcd makes
// (updates, secret requests, sandbox reports, renewal proofs) is signed
// here and checked by VerifyNode, on the control plane and in bcd alike.
func SignNode(key crypto.Signer, sigContext string, body []byte) ([]byte, error) {
	d := nodeDigest(sigContext, body)
	switch k := key.(type) {
	case *ecdsa.PrivateKey:
		sig, err := ecdsa.SignASN1(rand.Reader, k, d[:])
		if err != nil {
			return nil, fmt.Errorf("wire: sign: %w", err)
		}
		return sig, nil
	case ed25519.PrivateKey:
		return ed25519.Sign(k, d[:]), nil
	}
	return nil, errors.New("wire: unsupported node key type")
}

// VerifyNode reports whether sig is pub's SignNode signature of body under
// sigContext. A key of any other type never verifies.
func VerifyNode(pub crypto.PublicKey, sigContext string, body, sig []byte) bool {
	d := nodeDigest(sigContext, body)
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		return ecdsa.VerifyASN1(k, d[:], sig)
	case ed25519.PublicKey:
		return ed25519.Verify(k, d[:], sig)
	}
	return false
}

// SecretReleaseType is the JWE "typ" of a secret release.
const SecretReleaseType = "bc-secret+jwe"

// SecretRelease is the payload the broker seals to a request's one-time
// key and bcd opens: the value (standard base64), the reference and
// request it answers, and its expiry in Unix seconds (also in the JWE's
// protected "exp" header, which must agree).
type SecretRelease struct {
	Ref     string `json:"ref"`
	Version int64  `json:"version,omitempty"`
	Value   string `json:"value"`
	Exp     int64  `json:"exp"`
	Request string `json:"request_id"`
}
