package checkpoint

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"syscall"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// zstdWindow is the largest zstd window Pack uses and Materialize accepts:
// it bounds the decoder's memory whatever the archive claims.
const zstdWindow = 8 << 20

// Entry kinds an extractor remembers per name.
const (
	kindDir = iota + 1
	kindFile
	kindOther
)

// errStreamCap is what capReader returns past its cap.
var errStreamCap = errors.New("checkpoint: decompressed stream over its cap")

// extractor is one extraction: where it writes, its bounds, what it has
// seen, and the directories whose modes it applies last (they are made
// 0700 first, so a read-only directory can still be filled and emptied).
type extractor struct {
	ctx      context.Context
	root     *os.Root
	lim      Limits
	tr       *tar.Reader
	stream   *capReader
	entries  int
	unpacked int64 // declared sizes of regular files so far
	written  int64 // file bytes actually written
	seen     map[string]int
	dirs     []dirMode
}

type dirMode struct {
	name string
	mode fs.FileMode
}

// extract decompresses the verified archive in f and extracts it into
// root. It returns the extractor (tests read its counters) and the first
// refusal or error; the caller empties root on failure.
func extract(ctx context.Context, f io.Reader, root *os.Root, lim Limits) (*extractor, error) {
	dec, err := zstd.NewReader(f, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true),
		zstd.WithDecoderMaxWindow(zstdWindow), zstd.WithDecoderMaxMemory(zstdWindow))
	if err != nil {
		return nil, refuse(ReasonCorrupt, "zstd: %v", err)
	}
	defer dec.Close()
	cr := &capReader{ctx: ctx, r: dec, left: lim.streamCap()}
	x := &extractor{ctx: ctx, root: root, lim: lim, tr: tar.NewReader(cr), stream: cr, seen: map[string]int{}}
	return x, x.run()
}

// run extracts every entry, checks that the stream ends cleanly right
// after the tar's end (nothing hidden after it, no bad trailing frame),
// then applies the directories' modes, deepest first.
func (x *extractor) run() error {
	for {
		h, err := x.tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return x.streamErr(err)
		}
		x.entries++
		if x.entries > x.lim.MaxEntries {
			return refuse(ReasonTooManyEntries, "more than %d entries", x.lim.MaxEntries)
		}
		if err := x.entry(h); err != nil {
			return err
		}
	}
	if n, err := io.Copy(io.Discard, x.stream); err != nil || n != 0 {
		if err == nil {
			return refuse(ReasonCorrupt, "%d bytes after the end of the archive", n)
		}
		return x.streamErr(err)
	}
	for i := len(x.dirs) - 1; i >= 0; i-- {
		if err := x.root.Chmod(x.dirs[i].name, x.dirs[i].mode); err != nil {
			return fmt.Errorf("checkpoint: chmod %s: %w", x.dirs[i].name, err)
		}
	}
	return nil
}

// streamErr maps an error from the decompressed stream: past the cap is
// ReasonTooLarge, a done context is itself, anything else ReasonCorrupt.
func (x *extractor) streamErr(err error) error {
	switch {
	case errors.Is(err, errStreamCap):
		return refuse(ReasonTooLarge, "decompressed stream is over %d bytes", x.lim.streamCap())
	case x.ctx.Err() != nil:
		return fmt.Errorf("checkpoint: extract: %w", x.ctx.Err())
	default:
		return refuse(ReasonCorrupt, "%v", err)
	}
}

// entry checks one header and, when it is safe, writes it.
func (x *extractor) entry(h *tar.Header) error {
	name, err := checkName(h.Name, h.Typeflag == tar.TypeDir)
	if err != nil {
		return err
	}
	if err := checkType(name, h, x.lim.Whiteouts); err != nil {
		return err
	}
	if _, dup := x.seen[name]; dup {
		return refuse(ReasonDuplicate, "entry %q appears twice", name)
	}
	if d := path.Dir(name); d != "." && x.seen[d] != kindDir {
		return refuse(ReasonParent, "entry %q: %q is not an earlier directory of the archive", name, d)
	}
	mode := fs.FileMode(h.Mode & 0o777)
	if h.Mode&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	switch h.Typeflag {
	case tar.TypeDir:
		x.seen[name] = kindDir
		x.dirs = append(x.dirs, dirMode{name, mode | fs.ModeDir})
		if err := x.root.Mkdir(name, 0o700); err != nil {
			return wrapFS(name, err)
		}
		if x.lim.Whiteouts && h.PAXRecords[paxOpaque] == "y" {
			return wrapFS(name, x.setOpaque(name))
		}
		return nil
	case tar.TypeChar: // a whiteout, as checkType allows no other device
		x.seen[name] = kindOther
		return wrapFS(name, x.whiteout(name, mode))
	case tar.TypeReg:
		x.seen[name] = kindFile
		return x.file(name, mode, h.Size)
	case tar.TypeSymlink:
		x.seen[name] = kindOther
		if linkEscapes(name, h.Linkname) {
			return refuse(ReasonLinkEscapes, "symlink %q -> %q", name, h.Linkname)
		}
		return wrapFS(name, x.root.Symlink(h.Linkname, name))
	default: // tar.TypeLink, as checkType allows nothing else
		target, err := checkName(h.Linkname, false)
		if err != nil || x.seen[target] != kindFile {
			return refuse(ReasonHardLink, "hard link %q -> %q is not to an earlier regular file", name, h.Linkname)
		}
		x.seen[name] = kindFile
		return wrapFS(name, x.root.Link(target, name))
	}
}

// setOpaque marks the directory name, just made, overlay-opaque.
func (x *extractor) setOpaque(name string) error {
	d, err := x.root.Open(name)
	if err != nil {
		return err
	}
	defer d.Close()
	return unix.Fsetxattr(int(d.Fd()), opaqueXattr, []byte("y"), 0)
}

// whiteout makes name an overlay whiteout (character device 0/0) in its
// parent, an earlier directory of the archive opened through the root.
func (x *extractor) whiteout(name string, mode fs.FileMode) error {
	d, err := x.root.Open(path.Dir(name))
	if err != nil {
		return err
	}
	defer d.Close()
	return unix.Mknodat(int(d.Fd()), path.Base(name), unix.S_IFCHR|uint32(mode.Perm()), 0)
}

// checkType refuses every entry type but directories, regular files,
// symbolic and hard links, and with whiteouts a character device 0/0
// and nothing else; set-user-ID and set-group-ID bits; mode bits
// beyond 07777; and a size on anything but a regular file.
func checkType(name string, h *tar.Header, whiteouts bool) error {
	switch h.Typeflag {
	case tar.TypeDir, tar.TypeReg, tar.TypeSymlink, tar.TypeLink:
	case tar.TypeChar:
		if !whiteouts || h.Devmajor != 0 || h.Devminor != 0 || h.Mode&^0o777 != 0 {
			return refuse(ReasonDevice, "entry %q is a device node", name)
		}
	case tar.TypeBlock:
		return refuse(ReasonDevice, "entry %q is a device node", name)
	case tar.TypeFifo:
		return refuse(ReasonFIFO, "entry %q is a FIFO", name)
	default:
		return refuse(ReasonOtherType, "entry %q has type %q", name, string(h.Typeflag))
	}
	if h.Mode&0o6000 != 0 {
		return refuse(ReasonSetID, "entry %q has mode %o", name, h.Mode)
	}
	if h.Mode < 0 || h.Mode&^0o7777 != 0 {
		return refuse(ReasonCorrupt, "entry %q has mode %o beyond 07777", name, h.Mode)
	}
	if h.Typeflag != tar.TypeReg && h.Size != 0 {
		return refuse(ReasonCorrupt, "entry %q is not a regular file but has %d bytes", name, h.Size)
	}
	return nil
}

// file writes a regular file of size bytes, refusing before it creates
// anything when size would take the archive over MaxUnpackedBytes.
func (x *extractor) file(name string, mode fs.FileMode, size int64) error {
	if size < 0 || size > x.lim.MaxUnpackedBytes-x.unpacked {
		return refuse(ReasonTooLarge, "entry %q (%d bytes) takes the files over %d bytes", name, size, x.lim.MaxUnpackedBytes)
	}
	x.unpacked += size
	f, err := x.root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return wrapFS(name, err)
	}
	src := &readSide{r: io.LimitReader(x.tr, size)}
	n, err := io.Copy(f, src)
	x.written += n
	if src.err == nil && err == nil && n != size {
		src.err = io.ErrUnexpectedEOF
	}
	if src.err != nil || err != nil {
		f.Close()
		if src.err != nil {
			return x.streamErr(src.err)
		}
		return wrapFS(name, err)
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return wrapFS(name, err)
	}
	return wrapFS(name, f.Close())
}

// readSide remembers the error of its reader, so a copy's read errors
// (the archive) are told from its write errors (the disk).
type readSide struct {
	r   io.Reader
	err error
}

func (s *readSide) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF {
		s.err = err
	}
	return n, err
}

// wrapFS wraps a file-system error on an entry (nil stays nil).
func wrapFS(name string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("checkpoint: extract %q: %w", name, err)
}

// capReader reads at most left bytes of r, then fails with errStreamCap
// (not io.EOF, so a cut stream is never mistaken for a short one); it also
// fails once ctx is done.
type capReader struct {
	ctx  context.Context
	r    io.Reader
	left int64
}

func (c *capReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	if int64(len(p)) > c.left+1 {
		p = p[:c.left+1]
	}
	n, err := c.r.Read(p)
	if int64(n) > c.left {
		n = int(c.left)
		c.left = 0
		return n, errStreamCap
	}
	c.left -= int64(n)
	return n, err
}
