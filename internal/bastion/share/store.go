package share

import (
	"bytes"
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/internal/atomicfile"
)

// Share is one folder shared with the pairing, as kept in shares.json.
type Share struct {
	ID       string    `json:"id"`       // "sh_" + 12 lowercase base32 characters
	Path     string    `json:"path"`     // absolute, cleaned, symlinks resolved at Add
	Excludes []string  `json:"excludes"` // validated patterns (see NewMatcher)
	Created  time.Time `json:"created"`  // UTC
}

// storeName is the file in the data directory that holds the shares.
const storeName = "shares.json"

// storeVersion is the format of shares.json.
const storeVersion = 1

// storeFile is shares.json.
type storeFile struct {
	Version int     `json:"version"`
	Shares  []Share `json:"shares"`
}

// idEncoding is lowercase base32 without padding, as internal/ids uses.
var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// Add shares the folder at path with the excludes, recording it in
// dir/shares.json (0600, written atomically). path must be absolute and
// an existing folder; it is cleaned and its symlinks resolved once, and
// the share keeps the resolved path. It must neither hold dir nor lie
// inside it (ReasonHoldsDataDir): the data directory holds the bastion's
// keys. Add does not lock shares.json: two Adds at once may lose one.
func Add(dir, path string, excludes []string, now time.Time) (Share, error) {
	if !filepath.IsAbs(path) || strings.ContainsRune(path, 0) {
		return Share{}, refuse(ReasonPathInvalid, path)
	}
	m, err := NewMatcher(excludes)
	if err != nil {
		return Share{}, err
	}
	real, err := existingDir(filepath.Clean(path))
	if err != nil {
		return Share{}, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return Share{}, fmt.Errorf("share: data dir: %w", err)
	}
	data, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return Share{}, fmt.Errorf("share: data dir: %w", err)
	}
	if within(real, data) || within(data, real) {
		return Share{}, refuse(ReasonHoldsDataDir, path)
	}
	shares, err := List(dir)
	if err != nil {
		return Share{}, err
	}
	id, err := newID()
	if err != nil {
		return Share{}, err
	}
	s := Share{ID: id, Path: real, Excludes: m.normalised(), Created: now.UTC()}
	if err := save(dir, append(shares, s)); err != nil {
		return Share{}, err
	}
	return s, nil
}

// existingDir resolves path's symlinks and requires a folder there.
func existingDir(path string) (string, error) {
	real, err := filepath.EvalSymlinks(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", refuse(ReasonNotFound, path)
	}
	if err != nil {
		return "", fmt.Errorf("share: resolve folder: %w", err)
	}
	fi, err := os.Stat(real)
	if err != nil {
		return "", fmt.Errorf("share: stat folder: %w", err)
	}
	if !fi.IsDir() {
		return "", refuse(ReasonNotADir, path)
	}
	return real, nil
}

// within reports whether p is base or inside it (both absolute, clean).
func within(p, base string) bool {
	rel, err := filepath.Rel(base, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && !filepath.IsAbs(rel)
}

// newID returns "sh_" and 12 random lowercase base32 characters (60 bits).
func newID() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("share: id: %w", err)
	}
	return "sh_" + idEncoding.EncodeToString(b[:])[:12], nil
}

// List returns the shares in dir/shares.json (none when it does not
// exist).
func List(dir string) ([]Share, error) {
	raw, err := os.ReadFile(filepath.Join(dir, storeName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("share: read shares: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var f storeFile
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("share: parse shares: %w", err)
	}
	if f.Version != storeVersion {
		return nil, fmt.Errorf("share: shares file version %d, want %d", f.Version, storeVersion)
	}
	return f.Shares, nil
}

// save writes shares to dir/shares.json, 0600.
func save(dir string, shares []Share) error {
	if shares == nil {
		shares = []Share{}
	}
	raw, err := json.MarshalIndent(storeFile{Version: storeVersion, Shares: shares}, "", "  ")
	if err != nil {
		return fmt.Errorf("share: encode shares: %w", err)
	}
	if err := atomicfile.Write(filepath.Join(dir, storeName), append(raw, '\n'), 0o600); err != nil {
		return fmt.Errorf("share: write shares: %w", err)
	}
	return nil
}

// Remove stops sharing the share with id (ReasonUnknownShare if none).
// The folder itself is untouched.
func Remove(dir, id string) error {
	shares, err := List(dir)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(shares, func(s Share) bool { return s.ID == id })
	if i < 0 {
		return refuse(ReasonUnknownShare, id)
	}
	return save(dir, slices.Delete(shares, i, i+1))
}

// Find returns the share with id (ReasonUnknownShare if none).
func Find(dir, id string) (Share, error) {
	shares, err := List(dir)
	if err != nil {
		return Share{}, err
	}
	for _, s := range shares {
		if s.ID == id {
			return s, nil
		}
	}
	return Share{}, refuse(ReasonUnknownShare, id)
}
