package sandboxops

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/bettercompute/bettercompute/internal/atomicfile"
	"github.com/bettercompute/bettercompute/internal/daemon"
)

// Seen is the helper's own record of the sandbox command ids it admitted,
// so that a command the node (or anyone holding a copy) sends again is
// refused as replayed, also after the helper restarts. It is independent
// of the node's journal: the helper trusts nothing the node keeps.
//
// Each id is one 0600 file in a 0700 directory, named by the SHA-256 of
// the id (so no id can name a path) and holding the command's signed
// expiry in Unix milliseconds. Claiming an id publishes that file with
// link(2) (atomicfile.WriteNew), which fails if it exists: two copies of
// one command sent at once cannot both be admitted, in one process or
// across a restart. An entry is pruned once the command is expired by
// more than daemon.MaxSkew, when Check refuses it as expired anyway; the
// store holds at most the sandbox commands signed for this node in one
// command lifetime (daemon.MaxLifetime).
type Seen struct {
	dir string
}

// OpenSeen opens (making it, 0700) the store in dir and removes the temp
// files a crash in the middle of a claim can leave.
func OpenSeen(dir string) (*Seen, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("sandboxops: seen store: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("sandboxops: seen store: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("sandboxops: seen store: %w", err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
	return &Seen{dir: dir}, nil
}

func (s *Seen) path(id string) string {
	sum := sha256.Sum256([]byte(id))
	return filepath.Join(s.dir, hex.EncodeToString(sum[:]))
}

// Has reports whether id was claimed. A store it cannot read answers yes:
// a command is refused rather than perhaps run twice.
func (s *Seen) Has(id string) bool {
	_, err := os.Lstat(s.path(id))
	return !errors.Is(err, fs.ErrNotExist)
}

// Claim records id, which expires at expires, durably; it reports false
// when id was already claimed.
func (s *Seen) Claim(id string, expires time.Time) (bool, error) {
	err := atomicfile.WriteNew(s.path(id), []byte(strconv.FormatInt(expires.UnixMilli(), 10)), 0o600)
	switch {
	case errors.Is(err, fs.ErrExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("sandboxops: claim command id: %w", err)
	}
	return true, nil
}

// Prune removes the entries of commands expired by more than
// daemon.MaxSkew at now and returns how many it removed. An entry it
// cannot read is kept.
func (s *Seen) Prune(now time.Time) (int, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return 0, fmt.Errorf("sandboxops: prune seen store: %w", err)
	}
	cut := now.Add(-daemon.MaxSkew).UnixMilli()
	n := 0
	for _, e := range ents {
		if len(e.Name()) != 2*sha256.Size || !e.Type().IsRegular() {
			continue
		}
		p := filepath.Join(s.dir, e.Name())
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		exp, err := strconv.ParseInt(string(b), 10, 64)
		if err != nil || exp > cut {
			continue
		}
		if err := os.Remove(p); err == nil {
			n++
		}
	}
	return n, nil
}
