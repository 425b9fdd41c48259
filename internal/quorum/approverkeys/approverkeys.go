// Package approverkeys reads and writes destructive-batch approver key
// files. In production each approver makes their own key on their own
// machine and hands over only the public half; `approvers init` makes a
// set for a test or dev deployment.
//
// A private key file (approver-N.key) is a PKCS#8 "PRIVATE KEY" PEM block
// holding an Ed25519 key, mode 0600; a file readable or writable by group
// or other is refused. A public key file (approver-N.pub) is the base64 of
// the raw 32-byte key and a newline.
package approverkeys

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/secretfile"
)

// Generate makes n approver keys in dir (created 0700): approver-1.key ..
// approver-n.key and their .pub files, all 0600, refusing to overwrite an
// existing key file. It returns the public keys in file order.
func Generate(dir string, n int) ([]ed25519.PublicKey, error) {
	if n < 1 || n > pki.MaxApprovers {
		return nil, fmt.Errorf("approverkeys: count must be 1..%d", pki.MaxApprovers)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("approverkeys: %w", err)
	}
	for i := 1; i <= n; i++ {
		if _, err := os.Lstat(filepath.Join(dir, fmt.Sprintf("approver-%d.key", i))); err == nil {
			return nil, fmt.Errorf("approverkeys: %s already holds approver-%d.key", dir, i)
		}
	}
	out := make([]ed25519.PublicKey, 0, n)
	for i := 1; i <= n; i++ {
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("approverkeys: generate: %w", err)
		}
		pemKey, err := pki.MarshalPrivateKeyPEM(priv)
		if err != nil {
			return nil, err
		}
		base := filepath.Join(dir, fmt.Sprintf("approver-%d", i))
		if err := pki.WriteFileAtomic(base+".key", pemKey, 0o600); err != nil {
			return nil, err
		}
		if err := pki.WriteFileAtomic(base+".pub", []byte(base64.StdEncoding.EncodeToString(pub)+"\n"), 0o600); err != nil {
			return nil, err
		}
		out = append(out, pub)
	}
	return out, nil
}

// LoadPrivate reads an approver's private key file, refusing one that
// group or other may read or write.
func LoadPrivate(path string) (ed25519.PrivateKey, error) {
	data, err := secretfile.Read("approverkeys: approver key", path)
	if err != nil {
		return nil, err
	}
	k, err := pki.ParsePrivateKeyPEM(data)
	if err != nil {
		return nil, fmt.Errorf("approverkeys: %s: %w", path, err)
	}
	ek, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("approverkeys: %s is not an Ed25519 key", path)
	}
	return ek, nil
}

// ParsePublic parses a public key as written in a .pub file.
func ParsePublic(s string) (ed25519.PublicKey, error) {
	raw, err := base64.StdEncoding.Strict().DecodeString(strings.TrimSpace(s))
	if err != nil || len(raw) != ed25519.PublicKeySize {
		return nil, errors.New("approverkeys: not a base64 32-byte Ed25519 public key")
	}
	return ed25519.PublicKey(raw), nil
}

// LoadPublic reads public keys from each path: a directory contributes its
// *.pub files (in name order), a .pub file its key, a .key file the public
// half of its private key.
func LoadPublic(paths []string) ([]ed25519.PublicKey, error) {
	var files []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("approverkeys: %w", err)
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		m, err := filepath.Glob(filepath.Join(p, "*.pub"))
		if err != nil {
			return nil, fmt.Errorf("approverkeys: %w", err)
		}
		sort.Strings(m)
		if len(m) == 0 {
			return nil, fmt.Errorf("approverkeys: no .pub files in %s", p)
		}
		files = append(files, m...)
	}
	var out []ed25519.PublicKey
	for _, f := range files {
		if strings.HasSuffix(f, ".key") {
			k, err := LoadPrivate(f)
			if err != nil {
				return nil, err
			}
			out = append(out, k.Public().(ed25519.PublicKey))
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("approverkeys: %w", err)
		}
		k, err := ParsePublic(string(data))
		if err != nil {
			return nil, fmt.Errorf("%w (%s)", err, f)
		}
		out = append(out, k)
	}
	return out, nil
}
