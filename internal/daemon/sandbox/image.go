package sandbox

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"

	"gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob" // file:// image stores (the default)
	_ "gocloud.dev/blob/memblob"  // mem:// image stores (tests)

	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// Bounds on an image, checked while unpacking.
const (
	MaxImageBytes    = spec.MaxImageBytes // the tar
	MaxUnpackedBytes = 4 << 30            // the regular files in it
	MaxImageEntries  = 200_000
)

// ImageKey is where an image's tar lives in the object store.
func ImageKey(digest string) string { return spec.ImageKey(digest) }

// ErrDigestMismatch is returned when fetched bytes do not hash to the
// digest the command signed.
var ErrDigestMismatch = errors.New("image-digest-mismatch")

// ErrUnsafeImage is returned for a tar holding an absolute path, a ".."
// element, a device node, a FIFO, or a link that escapes the root.
var ErrUnsafeImage = errors.New("image-unsafe")

// Images fetches images by digest from an object store, verifies the
// digest before unpacking, unpacks safely, and caches one read-only root
// filesystem per digest under dir.
type Images struct {
	bucket *blob.Bucket
	dir    string
	mu     sync.Mutex
}

// OpenImages opens the image store at bucketURL (gocloud.dev/blob: file://,
// mem://, s3:// …) with its cache in dir.
func OpenImages(ctx context.Context, bucketURL, dir string) (*Images, error) {
	b, err := blob.OpenBucket(ctx, bucketURL)
	if err != nil {
		return nil, fmt.Errorf("sandbox: open image store: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		b.Close()
		return nil, fmt.Errorf("sandbox: image cache: %w", err)
	}
	return &Images{bucket: b, dir: dir}, nil
}

// Close closes the object store.
func (im *Images) Close() error { return im.bucket.Close() }

// Ensure returns the root filesystem of digest, fetching, verifying and
// unpacking it first when it is not cached.
func (im *Images) Ensure(ctx context.Context, digest string) (string, error) {
	if !spec.ValidDigest(digest) {
		return "", errors.New("image-digest-invalid")
	}
	hexd := strings.TrimPrefix(digest, "sha256:")
	final := filepath.Join(im.dir, hexd)
	rootfs := filepath.Join(final, "rootfs")
	im.mu.Lock()
	defer im.mu.Unlock()
	if _, err := os.Stat(rootfs); err == nil {
		return rootfs, nil
	}
	tmp := filepath.Join(im.dir, ".tmp-"+ids.New(""))
	if err := os.MkdirAll(filepath.Join(tmp, "rootfs"), 0o755); err != nil {
		return "", fmt.Errorf("sandbox: image staging: %w", err)
	}
	defer os.RemoveAll(tmp)
	tarPath := filepath.Join(tmp, "image.tar")
	if err := im.fetch(ctx, digest, tarPath); err != nil {
		return "", err
	}
	f, err := os.Open(tarPath)
	if err != nil {
		return "", fmt.Errorf("sandbox: open fetched image: %w", err)
	}
	defer f.Close()
	if err := Unpack(f, filepath.Join(tmp, "rootfs")); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, final); err != nil {
		return "", fmt.Errorf("sandbox: install image: %w", err)
	}
	return rootfs, nil
}

// fetch copies the image's tar to dst, hashing it on the way, and fails
// with ErrDigestMismatch unless it hashes to digest.
func (im *Images) fetch(ctx context.Context, digest, dst string) error {
	r, err := im.bucket.NewReader(ctx, ImageKey(digest), nil)
	if err != nil {
		return fmt.Errorf("image-unavailable: %w", err)
	}
	defer r.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("sandbox: stage image: %w", err)
	}
	defer out.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(out, h), io.LimitReader(r, MaxImageBytes+1))
	if err != nil {
		return fmt.Errorf("image-unavailable: %w", err)
	}
	if n > MaxImageBytes {
		return fmt.Errorf("%w: larger than %d bytes", ErrUnsafeImage, int64(MaxImageBytes))
	}
	if "sha256:"+hex.EncodeToString(h.Sum(nil)) != digest {
		return ErrDigestMismatch
	}
	return out.Sync()
}

// Unpack extracts a tar into dir through an os.Root, so no entry can
// write outside dir. It refuses (ErrUnsafeImage) absolute names, ".."
// elements, device nodes and FIFOs, symbolic links whose target leaves
// the root (absolute targets are read as rooted in the image, as they are
// inside the sandbox), hard links to anything but an earlier regular
// file, and images over the size and entry bounds. Set-user-ID and
// set-group-ID bits are dropped.
func Unpack(r io.Reader, dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("sandbox: open unpack root: %w", err)
	}
	defer root.Close()
	u := &unpacker{root: root, tr: tar.NewReader(r), regular: map[string]bool{}}
	for n := 0; ; n++ {
		h, err := u.tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%w: %v", ErrUnsafeImage, err)
		}
		if n >= MaxImageEntries {
			return fmt.Errorf("%w: more than %d entries", ErrUnsafeImage, MaxImageEntries)
		}
		if err := u.entry(h); err != nil {
			return err
		}
	}
}

// unpacker is one Unpack: the root it writes through, the tar, the bytes
// of regular files so far and the regular files an entry may hard-link.
type unpacker struct {
	root    *os.Root
	tr      *tar.Reader
	total   int64
	regular map[string]bool
}

// entry extracts one tar entry, then applies its owner (not a link's).
func (u *unpacker) entry(h *tar.Header) error {
	name, err := cleanName(h.Name)
	if err != nil {
		return err
	}
	if name == "." {
		return nil
	}
	mode := fs.FileMode(h.Mode) & (fs.ModePerm | fs.ModeSticky)
	if h.Mode&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	switch h.Typeflag {
	case tar.TypeDir:
		err = u.dir(name, mode)
	case tar.TypeReg:
		err = u.file(name, mode, h.Size)
	case tar.TypeSymlink:
		return u.symlink(name, h.Linkname) // ownership of a link is not applied
	case tar.TypeLink:
		return u.hardlink(name, h.Linkname)
	default:
		return fmt.Errorf("%w: %s has type %q (devices, FIFOs and others are refused)", ErrUnsafeImage, name, string(h.Typeflag))
	}
	if err != nil {
		return err
	}
	if h.Uid >= 0 && h.Gid >= 0 && h.Uid < 1<<31 && h.Gid < 1<<31 {
		if err := u.root.Lchown(name, h.Uid, h.Gid); err != nil && !errors.Is(err, fs.ErrPermission) {
			return fmt.Errorf("sandbox: chown %s: %w", name, err)
		}
	}
	return nil
}

func (u *unpacker) dir(name string, mode fs.FileMode) error {
	if err := u.root.MkdirAll(name, 0o755); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrUnsafeImage, name, err)
	}
	if err := u.root.Chmod(name, mode|fs.ModeDir); err != nil {
		return fmt.Errorf("sandbox: chmod %s: %w", name, err)
	}
	return nil
}

// file writes a regular file of size bytes from the tar, within
// MaxUnpackedBytes over the whole image.
func (u *unpacker) file(name string, mode fs.FileMode, size int64) error {
	u.total += size
	if u.total > MaxUnpackedBytes {
		return fmt.Errorf("%w: unpacks to more than %d bytes", ErrUnsafeImage, int64(MaxUnpackedBytes))
	}
	if err := mkParent(u.root, name); err != nil {
		return err
	}
	f, err := u.root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrUnsafeImage, name, err)
	}
	_, cerr := io.Copy(f, io.LimitReader(u.tr, size))
	if err := f.Close(); cerr == nil {
		cerr = err
	}
	if cerr != nil {
		return fmt.Errorf("sandbox: write %s: %w", name, cerr)
	}
	if err := u.root.Chmod(name, mode); err != nil {
		return fmt.Errorf("sandbox: chmod %s: %w", name, err)
	}
	u.regular[name] = true
	return nil
}

// symlink makes a symbolic link whose target stays in the root.
func (u *unpacker) symlink(name, target string) error {
	if escapes(name, target) {
		return fmt.Errorf("%w: symlink %s -> %s leaves the root", ErrUnsafeImage, name, target)
	}
	if err := mkParent(u.root, name); err != nil {
		return err
	}
	if err := u.root.Symlink(target, name); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrUnsafeImage, name, err)
	}
	return nil
}

// hardlink links name to an earlier regular file of the image.
func (u *unpacker) hardlink(name, linkname string) error {
	target, err := cleanName(linkname)
	if err != nil || !u.regular[target] {
		return fmt.Errorf("%w: hard link %s -> %s is not to an earlier file", ErrUnsafeImage, name, linkname)
	}
	if err := mkParent(u.root, name); err != nil {
		return err
	}
	if err := u.root.Link(target, name); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrUnsafeImage, name, err)
	}
	return nil
}

// cleanName turns a tar name into a relative slash path, refusing
// absolute names and any ".." element.
func cleanName(n string) (string, error) {
	if n == "" || strings.HasPrefix(n, "/") || strings.IndexByte(n, 0) >= 0 {
		return "", fmt.Errorf("%w: name %q", ErrUnsafeImage, n)
	}
	for _, el := range strings.Split(strings.TrimSuffix(n, "/"), "/") {
		if el == ".." {
			//lint:ignore ST1005 ".." is the path element refused, not punctuation
			return "", fmt.Errorf("%w: name %q has ..", ErrUnsafeImage, n)
		}
	}
	return path.Clean(n), nil
}

// escapes reports whether a symlink at name with target would resolve,
// lexically, above the image root. An absolute target starts at the
// root; a relative one at the link's directory.
func escapes(name, target string) bool {
	if target == "" || strings.IndexByte(target, 0) >= 0 {
		return true
	}
	depth := 0
	if !strings.HasPrefix(target, "/") {
		if d := path.Dir(name); d != "." {
			depth = len(strings.Split(d, "/"))
		}
	}
	for _, el := range strings.Split(target, "/") {
		switch el {
		case "", ".":
		case "..":
			depth--
			if depth < 0 {
				return true
			}
		default:
			depth++
		}
	}
	return false
}

func mkParent(root *os.Root, name string) error {
	if d := path.Dir(name); d != "." {
		if err := root.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("%w: %s: %v", ErrUnsafeImage, name, err)
		}
	}
	return nil
}
