package pki

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/bettercompute/bettercompute/internal/atomicfile"
)

// KEK is a 32-byte key-encryption key. It seals the control plane's private
// keys at rest (AES-256-GCM) and never itself appears in bundle.json.
type KEK [32]byte

// KEKEnv is the environment variable LoadKEK consults before the file.
const KEKEnv = "BC_KEK"

// ErrSealBroken is returned (wrapped) whenever sealed data does not open:
// tampering, truncation, an unknown version, a wrong key or a wrong aad.
var ErrSealBroken = errors.New("pki: sealed data does not open")

const (
	sealVersion = 1
	nonceSize   = 12
	maxKEKFile  = 4096
)

// decodeKEK parses base64 of exactly 32 bytes. Its errors never echo the input.
func decodeKEK(s string) (KEK, error) {
	var k KEK
	raw, err := base64.StdEncoding.Strict().DecodeString(strings.TrimSpace(s))
	if err != nil || len(raw) != len(k) {
		return k, errors.New("not base64 of 32 bytes")
	}
	copy(k[:], raw)
	clear(raw)
	if k == (KEK{}) {
		return k, errors.New("all-zero key")
	}
	return k, nil
}

// LoadKEK returns the KEK from the environment variable BC_KEK (base64 of 32
// bytes) when it is set and non-empty, else from the file at path, which must
// hold base64 of 32 bytes and must not be readable or writable by group or
// other. Errors name the source, never its content.
func LoadKEK(path string) (KEK, error) {
	if v := os.Getenv(KEKEnv); v != "" {
		k, err := decodeKEK(v)
		if err != nil {
			return KEK{}, fmt.Errorf("pki: %s: %v", KEKEnv, err)
		}
		return k, nil
	}
	return LoadKEKFile(path)
}

// LoadKEKFile is LoadKEK without the environment: the key in the file at
// path only, with the same checks. KEK rotation reads the new key with it,
// so that BC_KEK (the old key) cannot stand in for the new one.
func LoadKEKFile(path string) (KEK, error) {
	f, err := os.Open(path)
	if err != nil {
		return KEK{}, fmt.Errorf("pki: open KEK file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat() // stat the opened file, not the path, to avoid a swap in between
	if err != nil {
		return KEK{}, fmt.Errorf("pki: stat KEK file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return KEK{}, fmt.Errorf("pki: KEK file %s is not a regular file", path)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return KEK{}, fmt.Errorf("pki: KEK file %s has mode %04o; it must not be accessible by group or other (chmod 600)", path, fi.Mode().Perm())
	}
	data, err := io.ReadAll(io.LimitReader(f, maxKEKFile))
	if err != nil {
		return KEK{}, fmt.Errorf("pki: read KEK file %s: %w", path, err)
	}
	defer clear(data)
	k, err := decodeKEK(string(data))
	if err != nil {
		return KEK{}, fmt.Errorf("pki: KEK file %s: %v", path, err)
	}
	return k, nil
}

// CreateKEK makes a fresh random KEK and writes it, base64-encoded, to path
// with mode 0600 atomically. It refuses to overwrite an existing file, so a
// KEK that already seals keys can never be lost by accident.
func CreateKEK(path string) (KEK, error) {
	var k KEK
	if _, err := rand.Read(k[:]); err != nil {
		return KEK{}, fmt.Errorf("pki: generate KEK: %w", err)
	}
	enc := []byte(base64.StdEncoding.EncodeToString(k[:]) + "\n")
	defer clear(enc)
	if err := writeFileAtomic(path, enc, 0o600, true); err != nil {
		return KEK{}, err
	}
	return k, nil
}

func newGCM(kek KEK) (cipher.AEAD, error) {
	block, err := aes.NewCipher(kek[:])
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// Seal encrypts plaintext with AES-256-GCM under kek. aad is authenticated but
// not stored; it binds the ciphertext to its purpose. The output is
// version byte 1 || 12-byte random nonce || ciphertext+tag.
func Seal(kek KEK, plaintext, aad []byte) ([]byte, error) {
	if kek == (KEK{}) {
		return nil, errors.New("pki: refusing to seal under an all-zero KEK")
	}
	aead, err := newGCM(kek)
	if err != nil {
		return nil, fmt.Errorf("pki: seal: %w", err)
	}
	out := make([]byte, 1+nonceSize, 1+nonceSize+len(plaintext)+aead.Overhead())
	out[0] = sealVersion
	if _, err := rand.Read(out[1:]); err != nil {
		return nil, fmt.Errorf("pki: seal nonce: %w", err)
	}
	return aead.Seal(out, out[1:1+nonceSize], plaintext, aad), nil
}

// Open reverses Seal. Any failure (tampering, truncation, wrong version, wrong
// key, wrong aad) is reported as an error wrapping ErrSealBroken.
func Open(kek KEK, sealed, aad []byte) ([]byte, error) {
	aead, err := newGCM(kek)
	if err != nil || len(sealed) < 1+nonceSize+aead.Overhead() || sealed[0] != sealVersion {
		return nil, fmt.Errorf("pki: open: %w", ErrSealBroken)
	}
	pt, err := aead.Open(nil, sealed[1:1+nonceSize], sealed[1+nonceSize:], aad)
	if err != nil {
		return nil, fmt.Errorf("pki: open: %w", ErrSealBroken)
	}
	return pt, nil
}

// WriteFileAtomic writes data to path with the given mode via a temp file in
// the same directory, fsync, rename and fsync of the directory, so readers
// see either the old or the new content and a crash leaves no torn file.
func WriteFileAtomic(path string, data []byte, mode os.FileMode) error {
	return writeFileAtomic(path, data, mode, false)
}

// writeFileAtomic is WriteFileAtomic; with noReplace it fails if path
// exists (atomicfile.WriteNew).
func writeFileAtomic(path string, data []byte, mode os.FileMode, noReplace bool) error {
	if noReplace {
		return atomicfile.WriteNew(path, data, mode)
	}
	return atomicfile.Write(path, data, mode)
}
