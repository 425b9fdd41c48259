package checkpoint

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"gocloud.dev/blob"
	"gocloud.dev/blob/fileblob" // folder and file:// stores (the default); s3blob is not linked in this repository
	"gocloud.dev/gcerrors"
)

// ErrNotFound is returned (wrapped) by Store.Open and Store.Delete when no
// checkpoint has the digest.
var ErrNotFound = errors.New("checkpoint-not-found")

// keyPrefix is where checkpoints live in a bucket: keyPrefix + <hex>.
const keyPrefix = "checkpoints/sha256/"

// Store keeps checkpoints in an object store, each under the key
// "checkpoints/sha256/<hex>" of its digest. The key is only ever built
// from a digest that passed the strict "sha256:<64 lower-case hex>" check,
// so no digest string can name another key.
type Store struct {
	bucket *blob.Bucket
	lim    Limits
}

// OpenStore opens the store at url: a gocloud.dev/blob URL (file:///path;
// other schemes only when their driver is linked into the binary), or a
// bare folder path, which is created 0700 and opened with fileblob
// (temporary files next to the objects, so a rename never crosses mounts).
// Put accepts archives up to DefaultLimits().MaxArchiveBytes.
func OpenStore(ctx context.Context, url string) (*Store, error) {
	var b *blob.Bucket
	var err error
	if strings.Contains(url, "://") {
		b, err = blob.OpenBucket(ctx, url)
	} else {
		var dir string
		if dir, err = filepath.Abs(url); err == nil {
			b, err = fileblob.OpenBucket(dir, &fileblob.Options{CreateDir: true, DirFileMode: 0o700, NoTempDir: true})
		}
	}
	if err != nil {
		return nil, fmt.Errorf("checkpoint: open store: %w", err)
	}
	return &Store{bucket: b, lim: DefaultLimits()}, nil
}

// Close closes the bucket.
func (s *Store) Close() error { return s.bucket.Close() }

// key returns the object key of digest, or a ReasonBadDigest refusal.
func key(digest string) (string, error) {
	h, err := digestHex(digest)
	if err != nil {
		return "", err
	}
	return keyPrefix + h, nil
}

// Put stores the archive read from r under its digest and returns its
// Digest and Size (Entries and Bytes are 0: Put does not parse it).
//
// It spools r (at most MaxArchiveBytes, else ReasonTooLarge) to an
// unlinked temporary file while hashing, and only then writes the object
// under its final key, so no object is ever under a key its bytes do not
// hash to, and a failed Put leaves no object. An archive already stored is
// not written again. Put does not check the archive is a valid checkpoint:
// Materialize does that, after the digest, on every restore.
func (s *Store) Put(ctx context.Context, r io.Reader) (Info, error) {
	f, err := os.CreateTemp("", "checkpoint-put-*")
	if err != nil {
		return Info{}, fmt.Errorf("checkpoint: put: %w", err)
	}
	defer f.Close()
	if err := os.Remove(f.Name()); err != nil {
		return Info{}, fmt.Errorf("checkpoint: put: %w", err)
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(ctxReader{ctx, r}, s.lim.MaxArchiveBytes+1))
	if err != nil {
		return Info{}, fmt.Errorf("checkpoint: put: %w", err)
	}
	if n > s.lim.MaxArchiveBytes {
		return Info{}, refuse(ReasonTooLarge, "archive is over %d bytes", s.lim.MaxArchiveBytes)
	}
	info := Info{Digest: "sha256:" + hex.EncodeToString(h.Sum(nil)), Size: n}
	k := keyPrefix + info.Digest[len("sha256:"):]
	if ok, err := s.bucket.Exists(ctx, k); err != nil || ok {
		return info, wrapStore("put", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return Info{}, fmt.Errorf("checkpoint: put: %w", err)
	}
	opts := &blob.WriterOptions{ContentType: "application/zstd"}
	if err := s.bucket.Upload(ctx, k, f, opts); err != nil {
		return Info{}, wrapStore("put", err)
	}
	return info, nil
}

// Open returns the stored archive of digest, unverified: pass it to
// Materialize with the same digest. A missing object is ErrNotFound.
func (s *Store) Open(ctx context.Context, digest string) (io.ReadCloser, error) {
	k, err := key(digest)
	if err != nil {
		return nil, err
	}
	r, err := s.bucket.NewReader(ctx, k, nil)
	if err != nil {
		return nil, wrapStore("open", err)
	}
	return r, nil
}

// Exists reports whether a checkpoint with digest is stored.
func (s *Store) Exists(ctx context.Context, digest string) (bool, error) {
	k, err := key(digest)
	if err != nil {
		return false, err
	}
	ok, err := s.bucket.Exists(ctx, k)
	return ok, wrapStore("exists", err)
}

// Delete removes the checkpoint with digest; a missing one is ErrNotFound.
func (s *Store) Delete(ctx context.Context, digest string) error {
	k, err := key(digest)
	if err != nil {
		return err
	}
	return wrapStore("delete", s.bucket.Delete(ctx, k))
}

// wrapStore wraps a bucket error, as ErrNotFound when the object is missing.
func wrapStore(op string, err error) error {
	switch {
	case err == nil:
		return nil
	case gcerrors.Code(err) == gcerrors.NotFound:
		return fmt.Errorf("checkpoint: %s: %w: %v", op, ErrNotFound, err)
	default:
		return fmt.Errorf("checkpoint: %s: %w", op, err)
	}
}
