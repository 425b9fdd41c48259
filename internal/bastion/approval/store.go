package approval

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/bettercompute/bettercompute/internal/atomicfile"
	"github.com/bettercompute/bettercompute/internal/clock"
)

// The files this package keeps in the data folder.
const (
	lockFile      = "approval.lock"     // flocked for every read-modify-write
	factorFile    = "factor.sealed"     // the TOTP secret and the last accepted step
	approvalsFile = "approvals.sealed"  // requests and the refused-write times
	opsFile       = "ops.json"          // standing grants, one sealed blob per record
	rootFile      = "root-grant.sealed" // the root command grant
	anchorFile    = "anchor.sealed"     // the anchor mark
)

// The HKDF purposes (info) of the seal keys, one per file kind.
const (
	purposeFactor    = "bc-bastion factor v1"
	purposeApprovals = "bc-bastion approvals v1"
	purposeOps       = "bc-bastion ops.json v1"
	purposeRoot      = "bc-bastion root-grant v1"
	purposeAnchor    = "bc-bastion anchor v1"
)

// fileVersion is the only V the sealed plaintexts carry.
const fileVersion = 1

// maxFileBytes caps what is read of any file here; a larger one does not
// open.
const maxFileBytes = 4 << 20

// minSecret is the shortest Config.Secret OpenStore takes.
const minSecret = 16

// Config says where the store lives and what it seals with.
type Config struct {
	Dir       string      // the bastion's data folder
	Secret    []byte      // the bastion's own private key bytes (IKM for every seal key)
	BastionID string      // bound into every seal's additional data
	Clock     clock.Clock // internal/clock
}

// Store is the approvals state of one bastion's data folder. It holds no
// state of its own between calls: every call re-reads the files, so two
// Stores (or two processes) on one folder see each other's changes.
type Store struct {
	dir     string
	secret  []byte
	bastion string
	clock   clock.Clock
}

// OpenStore checks cfg and makes the data folder (0700) if it is missing.
// A folder that group or others can use is refused.
func OpenStore(cfg Config) (*Store, error) {
	switch {
	case cfg.Dir == "":
		return nil, errors.New("approval: no data folder")
	case len(cfg.Secret) < minSecret:
		return nil, fmt.Errorf("approval: secret of %d bytes, want at least %d", len(cfg.Secret), minSecret)
	case cfg.BastionID == "" || len(cfg.BastionID) > 256 || strings.ContainsRune(cfg.BastionID, 0):
		return nil, errors.New("approval: bad bastion id")
	case cfg.Clock == nil:
		return nil, errors.New("approval: no clock")
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("approval: data folder: %w", err)
	}
	fi, err := os.Stat(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("approval: data folder: %w", err)
	}
	if !fi.IsDir() || fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("approval: data folder %s is %v, want a directory of mode 0700", cfg.Dir, fi.Mode())
	}
	return &Store{
		dir:     cfg.Dir,
		secret:  append([]byte(nil), cfg.Secret...),
		bastion: cfg.BastionID,
		clock:   cfg.Clock,
	}, nil
}

// withLock runs fn holding an exclusive flock on DIR/approval.lock. The
// lock file is opened anew each time, so the lock also excludes other
// goroutines and Stores of this process.
func (s *Store) withLock(fn func() error) error {
	f, err := os.OpenFile(s.path(lockFile), os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("approval: open lock: %w", err)
	}
	defer f.Close()
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("approval: lock: %w", err)
	}
	defer unix.Flock(int(f.Fd()), unix.LOCK_UN) //nolint:errcheck // Close releases it too
	return fn()
}

// path returns the file name in the data folder.
func (s *Store) path(name string) string { return filepath.Join(s.dir, name) }

// fileAAD is the additional data of a one-record file: its label and the
// bastion id.
func (s *Store) fileAAD(label string) []byte {
	return []byte("bc-bastion-" + label + "\x00" + s.bastion)
}

// readFile returns the file's bytes and whether it exists. It does not
// follow a link; a file over maxFileBytes is a ReasonSealBroken refusal.
func (s *Store) readFile(name string) ([]byte, bool, error) {
	f, err := os.OpenFile(s.path(name), os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, true, fmt.Errorf("approval: read %s: %w", name, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err != nil {
		return nil, true, fmt.Errorf("approval: read %s: %w", name, err)
	}
	if len(b) > maxFileBytes {
		return nil, true, refuse(ReasonSealBroken, name+" is too large")
	}
	return b, true, nil
}

// loadSealed opens a one-record file into v. It reports whether the file
// exists; one that does not open (or decode) is a ReasonSealBroken refusal.
func (s *Store) loadSealed(name, purpose, label string, v any) (bool, error) {
	b, ok, err := s.readFile(name)
	if err != nil || !ok {
		return ok, err
	}
	pt, err := Open(DeriveKey(s.secret, purpose), s.fileAAD(label), b)
	if err != nil {
		return true, err
	}
	if err := json.Unmarshal(pt, v); err != nil {
		return true, refuse(ReasonSealBroken, name+" does not decode")
	}
	return true, nil
}

// saveSealed seals v and writes it whole as name (0600).
func (s *Store) saveSealed(name, purpose, label string, v any) error {
	pt, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("approval: encode %s: %w", name, err)
	}
	b, err := Seal(DeriveKey(s.secret, purpose), s.fileAAD(label), pt)
	if err != nil {
		return err
	}
	return atomicfile.Write(s.path(name), b, 0o600)
}

// remove deletes name; a missing file is no error.
func (s *Store) remove(name string) error {
	if err := os.Remove(s.path(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("approval: remove %s: %w", name, err)
	}
	return nil
}
