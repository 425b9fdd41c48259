package sshca

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/bettercompute/bettercompute/internal/errs"
)

// Reasons an ssh.access payload is refused on the node.
const (
	ReasonAccessMalformed = "ssh-access-malformed"        // not exactly an Access, or out of bounds
	ReasonAccessOtherNode = "ssh-access-other-node"       // names another node
	ReasonAccessStale     = "ssh-access-stale-generation" // older than the state the node has
)

// Bounds of an Access payload: it travels as a command payload (at most
// 64 KiB), and a node never has more live break-glass accounts or
// unexpired revoked certificates than this.
const (
	MaxAccessBytes    = 60 << 10
	MaxAccessAccounts = 64
	MaxAccessRevoked  = 2048
)

// Access is the break-glass state of one node, the payload of the
// ssh.access command: the CA sshd trusts, the accounts that have
// principals files, and the revoked serials of the node's KRL. Generation
// grows with every state the control plane makes for the node; a node
// keeps the highest it applied and refuses an older one, so two queued
// states never let the older overwrite the newer. IssuedAt (unix seconds)
// is the KRL's generated date, so the KRL is a function of the payload
// alone and the control plane can rebuild the one the node has.
type Access struct {
	Generation uint64   `json:"generation"`
	NodeID     string   `json:"node_id"`
	CA         string   `json:"ca"` // authorized_keys line of the break-glass CA
	Accounts   []string `json:"accounts"`
	Revoked    []uint64 `json:"revoked"`
	IssuedAt   int64    `json:"issued_at"`
}

// malformed is the refusal of a payload that is not a valid Access.
func malformed(detail string) error {
	return refuse(errs.InvalidInput, ReasonAccessMalformed, detail)
}

// check validates a and returns its CA key.
func (a Access) check() (ssh.PublicKey, error) {
	if a.Generation == 0 {
		return nil, malformed("generation must be at least 1")
	}
	if !ValidNodeID(a.NodeID) {
		return nil, malformed("node_id is not a node id")
	}
	ca, err := ParsePublicKey([]byte(a.CA))
	if err != nil {
		return nil, malformed("ca is not one SSH public key")
	}
	if len(a.Accounts) > MaxAccessAccounts || len(a.Revoked) > MaxAccessRevoked {
		return nil, malformed(fmt.Sprintf("at most %d accounts and %d revoked serials", MaxAccessAccounts, MaxAccessRevoked))
	}
	for i, acc := range a.Accounts {
		if !ValidAccount(acc) || slices.Contains(a.Accounts[:i], acc) {
			return nil, malformed("accounts must be distinct Unix account names")
		}
	}
	if slices.Contains(a.Revoked, 0) {
		return nil, malformed("serial 0 cannot be revoked")
	}
	if a.IssuedAt < 0 {
		return nil, malformed("issued_at must not be negative")
	}
	return ca, nil
}

// Marshal validates a and encodes it (compact JSON).
func (a Access) Marshal() ([]byte, error) {
	if _, err := a.check(); err != nil {
		return nil, err
	}
	if a.Accounts == nil {
		a.Accounts = []string{}
	}
	if a.Revoked == nil {
		a.Revoked = []uint64{}
	}
	return json.Marshal(a)
}

// DecodeAccess decodes an ssh.access payload strictly: one JSON object of
// at most MaxAccessBytes with exactly Access's fields (unknown fields,
// trailing data and out-of-bounds values refused as ReasonAccessMalformed),
// and returns it with its CA key.
func DecodeAccess(payload []byte) (Access, ssh.PublicKey, error) {
	if len(payload) > MaxAccessBytes {
		return Access{}, nil, malformed(fmt.Sprintf("payload over %d bytes", MaxAccessBytes))
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	var a Access
	if err := dec.Decode(&a); err != nil {
		return Access{}, nil, malformed("not an ssh.access object")
	}
	if _, err := dec.Token(); err != io.EOF {
		return Access{}, nil, malformed("trailing data after the object")
	}
	ca, err := a.check()
	if err != nil {
		return Access{}, nil, err
	}
	return a, ca, nil
}

// KRL returns the node's key revocation list of state a, with ca its CA.
func (a Access) KRL(ca ssh.PublicKey) KRL {
	return KRL{CA: ca, Version: a.Generation, Serials: a.Revoked, Generated: time.Unix(a.IssuedAt, 0)}
}

// Files returns what WriteSSHDFiles writes for state a.
func (a Access) Files(ca ssh.PublicKey) Files {
	return Files{CA: ca, NodeID: a.NodeID, Accounts: a.Accounts, KRL: a.KRL(ca)}
}
