package daemon

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/bettercompute/bettercompute/internal/atomicfile"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/secretfile"
)

// File names under a node's data directory. All are 0600.
const (
	joinFile     = "join.json"     // the join record: node id, gateway, pinned bundle
	identityFile = "identity.json" // the node key and its current certificate chain
	stateFile    = "state.json"    // the highest signed time statement accepted
	journalFile  = "journal.log"
	// spentFile holds the tunnel, exec and preview tickets' jtis this
	// node accepted, so a restart refuses them as spent (spentfile).
	spentFile = "tickets-spent.jsonl"
)

// JoinRecord is what bcd keeps from its join: its node id, and the trust
// bundle it pins with the join key whose signature verified it. At join
// that key is the one the token's pin names; a refresh (refresh.go)
// replaces the bundle with a newer one signed by a join key the pinned
// bundle allows, and that key and its pin. The format is the one written
// before refresh existed, so older records load unchanged.
type JoinRecord struct {
	NodeID  string `json:"node_id"`
	Gateway string `json:"gateway"`
	// Pin is the SHA-256 pin of JoinPublicKey (pki.JoinKeyPin): at join,
	// the token's.
	Pin []byte `json:"pin"`
	// JoinPublicKey is the join key whose signature BundleSig is.
	JoinPublicKey []byte `json:"join_public_key"`
	BundleBody    []byte `json:"bundle_body"`
	BundleSig     []byte `json:"bundle_sig"`
}

// identity is the node's key and certificate chain (leaf first).
type identity struct {
	KeyPEM []byte   `json:"key_pem"`
	Chain  [][]byte `json:"chain"`
}

type state struct {
	HighestServerTimeMS int64 `json:"highest_server_time_ms"`
}

func writeJSON(dir, name string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("daemon: encode %s: %w", name, err)
	}
	if err := atomicfile.Write(filepath.Join(dir, name), b, 0o600); err != nil {
		return fmt.Errorf("daemon: write %s: %w", name, err)
	}
	return nil
}

func readJSON(dir, name string, v any) error {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("daemon: decode %s: %w", name, err)
	}
	return nil
}

// readSecretJSON is readJSON for a file that holds a private key: one
// that group or other may access is refused (secretfile), as ssh refuses
// an open private key, so a key left readable is found before it is used.
func readSecretJSON(dir, name string, v any) error {
	b, err := secretfile.Read("daemon: "+name, filepath.Join(dir, name))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("daemon: decode %s: %w", name, err)
	}
	return nil
}

// ErrNotJoined is returned when the data directory holds no join record.
var ErrNotJoined = errors.New("daemon: not joined (run bcd join first)")

// Joined reports whether dir holds a join record.
func Joined(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, joinFile))
	return err == nil
}

func (id *identity) parse() (crypto.Signer, []*x509.Certificate, error) {
	key, err := pki.ParsePrivateKeyPEM(id.KeyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("daemon: node key: %w", err)
	}
	var chain []*x509.Certificate
	for _, der := range id.Chain {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, nil, fmt.Errorf("daemon: node certificate: %w", err)
		}
		chain = append(chain, c)
	}
	if len(chain) == 0 {
		return nil, nil, errors.New("daemon: no node certificate")
	}
	if pub, ok := key.Public().(*ecdsa.PublicKey); ok {
		if cp, ok := chain[0].PublicKey.(*ecdsa.PublicKey); !ok || !cp.Equal(pub) {
			return nil, nil, errors.New("daemon: node certificate does not match node key")
		}
	}
	return key, chain, nil
}
