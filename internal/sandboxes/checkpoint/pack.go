package checkpoint

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"syscall"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// opaqueXattr marks an overlayfs directory opaque (its lower directory
// hidden); paxOpaque is how an archive records it (the SCHILY.xattr form
// GNU tar and archive/tar read).
const (
	opaqueXattr = "trusted.overlay.opaque"
	paxOpaque   = "SCHILY.xattr." + opaqueXattr
)

// Info describes a checkpoint archive.
type Info struct {
	// Digest is "sha256:<hex>" of the compressed bytes: the checkpoint's address.
	Digest string
	// Size is the compressed size in bytes.
	Size int64
	// Entries is the number of tar entries (0 when unknown, as from Store.Put).
	Entries int
	// Bytes is the sum of the regular files' sizes (0 when unknown).
	Bytes int64
}

// Pack writes the checkpoint of dir to w: a tar of everything under dir
// (not dir itself) in fs.WalkDir's lexical order, without following any
// symbolic link, with uid, gid, user and group names zeroed and every time
// the Unix epoch, zstd-compressed with one encoder goroutine and an 8 MiB
// window, so the same tree gives the same bytes. Hard links within dir are
// kept (the later names link to the first).
//
// It refuses what Materialize would refuse, with the same reasons: device
// nodes (but whiteouts with Limits.Whiteouts, which also records opaque
// directories), FIFOs, sockets and other types, set-user-ID and set-group-ID bits
// (refused rather than dropped, so a checkpoint never silently differs from
// its layer), names that are not canonical or hold a backslash, symbolic
// links that leave the root, and a tree over lim. dir should not change
// while Pack runs (freeze or stop the sandbox first); a file that changes
// type or shrinks meanwhile fails Pack. On failure w holds a partial
// archive the caller must discard.
func Pack(ctx context.Context, dir string, w io.Writer, lim Limits) (Info, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return Info{}, fmt.Errorf("checkpoint: open source: %w", err)
	}
	defer root.Close()
	out := &hashCounter{w: w, h: sha256.New(), max: lim.MaxArchiveBytes}
	enc, err := zstd.NewWriter(out, zstd.WithWindowSize(zstdWindow), zstd.WithEncoderConcurrency(1))
	if err != nil {
		return Info{}, fmt.Errorf("checkpoint: zstd: %w", err)
	}
	p := &packer{ctx: ctx, root: root, lim: lim, tw: tar.NewWriter(enc), links: map[fileID]string{}}
	err = fs.WalkDir(root.FS(), ".", p.visit)
	if err == nil {
		err = p.tw.Close()
	}
	if cerr := enc.Close(); err == nil {
		err = cerr
	}
	if out.refused != nil {
		return Info{}, out.refused
	}
	if err != nil {
		if ReasonOf(err) == "" && !errors.Is(err, ctx.Err()) {
			err = fmt.Errorf("checkpoint: pack: %w", err)
		}
		return Info{}, err
	}
	return Info{Digest: "sha256:" + hex.EncodeToString(out.h.Sum(nil)), Size: out.n, Entries: p.entries, Bytes: p.bytes}, nil
}

// fileID identifies a file across its hard links.
type fileID struct{ dev, ino uint64 }

// packer is one Pack: the tree it reads, its bounds and counts, and the
// first name of each multiply-linked file.
type packer struct {
	ctx     context.Context
	root    *os.Root
	lim     Limits
	tw      *tar.Writer
	entries int
	bytes   int64
	links   map[fileID]string
}

// visit writes the entry for one walked name.
func (p *packer) visit(name string, d fs.DirEntry, err error) error {
	if err != nil {
		return err
	}
	if err := p.ctx.Err(); err != nil {
		return err
	}
	if name == "." {
		return nil
	}
	if _, err := checkName(name, false); err != nil {
		return err
	}
	info, err := d.Info()
	if err != nil {
		return err
	}
	if p.entries++; p.entries > p.lim.MaxEntries {
		return refuse(ReasonTooManyEntries, "more than %d entries", p.lim.MaxEntries)
	}
	m := info.Mode()
	if m&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
		return refuse(ReasonSetID, "%q has mode %v", name, m)
	}
	h := &tar.Header{Name: name, Mode: int64(m.Perm()), ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
	if m&fs.ModeSticky != 0 {
		h.Mode |= 0o1000
	}
	switch m.Type() {
	case fs.ModeDir:
		h.Typeflag, h.Name = tar.TypeDir, name+"/"
		if err := p.opaque(h, name); err != nil {
			return err
		}
		return p.tw.WriteHeader(h)
	case fs.ModeSymlink:
		return p.symlink(h)
	case 0:
		return p.regular(h, info)
	case fs.ModeDevice | fs.ModeCharDevice:
		if st, ok := info.Sys().(*syscall.Stat_t); ok && p.lim.Whiteouts && st.Rdev == 0 {
			h.Typeflag = tar.TypeChar // an overlay whiteout: device 0/0
			return p.tw.WriteHeader(h)
		}
		return refuse(ReasonDevice, "%q is a device node", name)
	case fs.ModeDevice:
		return refuse(ReasonDevice, "%q is a device node", name)
	case fs.ModeNamedPipe:
		return refuse(ReasonFIFO, "%q is a FIFO", name)
	default:
		return refuse(ReasonOtherType, "%q has type %v", name, m.Type())
	}
}

// opaque adds the overlay opaque attribute to directory header h when
// Whiteouts is on and the directory name carries it with value "y".
func (p *packer) opaque(h *tar.Header, name string) error {
	if !p.lim.Whiteouts {
		return nil
	}
	d, err := p.root.Open(name)
	if err != nil {
		return err
	}
	defer d.Close()
	buf := make([]byte, 8)
	n, err := unix.Fgetxattr(int(d.Fd()), opaqueXattr, buf)
	switch {
	case errors.Is(err, unix.ENODATA), errors.Is(err, unix.ENOTSUP), errors.Is(err, unix.ERANGE):
		return nil
	case err != nil:
		return fmt.Errorf("%q: read opaque attribute: %w", name, err)
	case string(buf[:n]) == "y":
		h.PAXRecords = map[string]string{paxOpaque: "y"}
	}
	return nil
}

// symlink writes a symbolic link, refusing one whose target leaves dir.
func (p *packer) symlink(h *tar.Header) error {
	target, err := p.root.Readlink(h.Name)
	if err != nil {
		return err
	}
	if linkEscapes(h.Name, target) {
		return refuse(ReasonLinkEscapes, "symlink %q -> %q", h.Name, target)
	}
	h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, target, 0o777
	return p.tw.WriteHeader(h)
}

// regular writes a regular file, or a hard link to the first name of a
// file already written.
func (p *packer) regular(h *tar.Header, info fs.FileInfo) error {
	st, ok := info.Sys().(*syscall.Stat_t)
	if ok && st.Nlink > 1 {
		id := fileID{uint64(st.Dev), st.Ino}
		if first, seen := p.links[id]; seen {
			h.Typeflag, h.Linkname = tar.TypeLink, first
			return p.tw.WriteHeader(h)
		}
		p.links[id] = h.Name
	}
	f, err := p.root.OpenFile(h.Name, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !os.SameFile(fi, info) || !fi.Mode().IsRegular() {
		return fmt.Errorf("%q changed while packing", h.Name)
	}
	if fi.Size() > p.lim.MaxUnpackedBytes-p.bytes {
		return refuse(ReasonTooLarge, "files are over %d bytes at %q", p.lim.MaxUnpackedBytes, h.Name)
	}
	p.bytes += fi.Size()
	h.Typeflag, h.Size = tar.TypeReg, fi.Size()
	if err := p.tw.WriteHeader(h); err != nil {
		return err
	}
	n, err := io.Copy(p.tw, io.LimitReader(f, h.Size))
	if err == nil && n != h.Size {
		err = fmt.Errorf("%q shrank while packing", h.Name)
	}
	return err
}

// hashCounter passes writes to w while hashing and counting them, and
// refuses ReasonTooLarge past max bytes.
type hashCounter struct {
	w       io.Writer
	h       hash.Hash
	n, max  int64
	refused error
}

func (c *hashCounter) Write(b []byte) (int, error) {
	if int64(len(b)) > c.max-c.n {
		c.refused = refuse(ReasonTooLarge, "archive is over %d bytes", c.max)
		return 0, c.refused
	}
	n, err := c.w.Write(b)
	c.h.Write(b[:n])
	c.n += int64(n)
	return n, err
}
