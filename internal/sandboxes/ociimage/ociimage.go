// Package ociimage turns an OCI image (an OCI image layout directory or a
// `docker save` archive) into a sandbox image: one tar of the root
// filesystem its layers make, in the deterministic form imagetar writes,
// ready for the same import as a --rootfs or --tar image.
package ociimage

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// refAnnotation names an image in an OCI layout's index.
const refAnnotation = "org.opencontainers.image.ref.name"

// Open returns the image at src: an OCI image layout directory (with
// index.json), or a `docker save` archive. ref picks one image when src
// holds several (a layout's ref.name annotation, or an archive's
// "repo:tag"); "" takes the only one. In a multi-platform index the
// linux image of this machine's architecture is taken.
func Open(src, ref string) (v1.Image, error) {
	fi, err := os.Stat(src)
	if err != nil {
		return nil, fmt.Errorf("ociimage: %w", err)
	}
	if !fi.IsDir() {
		var tag *name.Tag
		if ref != "" {
			t, err := name.NewTag(ref)
			if err != nil {
				return nil, fmt.Errorf("ociimage: --ref %q: %w", ref, err)
			}
			tag = &t
		}
		img, err := tarball.ImageFromPath(src, tag)
		if err != nil {
			return nil, fmt.Errorf("ociimage: %s is not a docker save archive (nor an OCI layout directory): %w", src, err)
		}
		return img, nil
	}
	idx, err := layout.ImageIndexFromPath(src)
	if err != nil {
		return nil, fmt.Errorf("ociimage: %s is not an OCI image layout: %w", src, err)
	}
	return pick(idx, ref, 0)
}

// pick finds the one image of idx that ref names (any when ref is ""),
// descending into nested indexes for this machine's platform.
func pick(idx v1.ImageIndex, ref string, depth int) (v1.Image, error) {
	if depth > 4 {
		return nil, errors.New("ociimage: indexes nest too deep")
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("ociimage: read index: %w", err)
	}
	var found []v1.Descriptor
	for _, d := range m.Manifests {
		if depth == 0 && ref != "" && d.Annotations[refAnnotation] != ref {
			continue
		}
		if depth > 0 && d.Platform != nil && (d.Platform.OS != "linux" || d.Platform.Architecture != runtime.GOARCH) {
			continue
		}
		found = append(found, d)
	}
	if len(found) != 1 {
		return nil, fmt.Errorf("ociimage: %d images match (give --ref with one of: %s)", len(found), refs(m))
	}
	d := found[0]
	if d.MediaType.IsIndex() {
		child, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return nil, fmt.Errorf("ociimage: read index: %w", err)
		}
		return pick(child, "", depth+1)
	}
	img, err := idx.Image(d.Digest)
	if err != nil {
		return nil, fmt.Errorf("ociimage: read image: %w", err)
	}
	return img, nil
}

func refs(m *v1.IndexManifest) string {
	var out []string
	for _, d := range m.Manifests {
		if r := d.Annotations[refAnnotation]; r != "" {
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		return "none are named"
	}
	return strings.Join(out, ", ")
}

// Stats tells what Flatten wrote and left out.
type Stats struct {
	Entries int
	Bytes   int64
	// Skipped are entries a sandbox image cannot hold (device nodes,
	// FIFOs), left out.
	Skipped []string
}

// entry is one file of the flattened tree, its content at off in the
// spool.
type entry struct {
	h   *tar.Header
	off int64
}

// Flatten writes img's root filesystem to w as a sandbox image tar: the
// layers applied in order with their whiteouts (mutate.Extract), entries
// sorted by path, times zeroed, owners kept as numbers, hard links
// written as copies of their file, device nodes and FIFOs left out. The
// files' content is spooled to a temporary file, at most maxBytes of it.
func Flatten(img v1.Image, w io.Writer, maxBytes int64) (Stats, error) {
	spool, err := os.CreateTemp("", "bc-oci-")
	if err != nil {
		return Stats{}, fmt.Errorf("ociimage: spool: %w", err)
	}
	defer os.Remove(spool.Name())
	defer spool.Close()
	rc := mutate.Extract(img)
	defer rc.Close()
	entries, st, err := read(tar.NewReader(rc), spool, maxBytes)
	if err != nil {
		return Stats{}, err
	}
	st.Entries, err = write(w, entries, spool, maxBytes)
	return st, err
}

// read spools the flattened tar's entries.
func read(tr *tar.Reader, spool *os.File, maxBytes int64) (map[string]entry, Stats, error) {
	var st Stats
	entries := map[string]entry{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return entries, st, nil
		}
		if err != nil {
			return nil, st, fmt.Errorf("ociimage: flatten: %w", err)
		}
		n := path.Clean(strings.TrimPrefix(h.Name, "/"))
		if n == "." || n == ".." || strings.HasPrefix(n, "../") {
			continue
		}
		switch h.Typeflag {
		case tar.TypeReg, tar.TypeDir, tar.TypeSymlink, tar.TypeLink:
		default:
			st.Skipped = append(st.Skipped, n)
			continue
		}
		e := entry{h: h}
		if h.Typeflag == tar.TypeReg {
			if st.Bytes += h.Size; st.Bytes > maxBytes {
				return nil, st, fmt.Errorf("ociimage: the image's files are larger than %d bytes", maxBytes)
			}
			if e.off, err = spool.Seek(0, io.SeekEnd); err != nil {
				return nil, st, fmt.Errorf("ociimage: spool: %w", err)
			}
			if _, err := io.CopyN(spool, tr, h.Size); err != nil {
				return nil, st, fmt.Errorf("ociimage: spool: %w", err)
			}
		}
		h.Name = n
		entries[n] = e
	}
}

// write writes the spooled entries in path order. A hard link is written
// as a copy of its target, so the bytes written, copies included, are
// bounded by maxBytes too: many links to one large file cannot grow the
// tar past it.
func write(w io.Writer, entries map[string]entry, spool *os.File, maxBytes int64) (count int, err error) {
	var written int64
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	tw := tar.NewWriter(w)
	for _, n := range names {
		e := entries[n]
		src := e.h
		if src.Typeflag == tar.TypeLink {
			target, ok := entries[path.Clean(strings.TrimPrefix(src.Linkname, "/"))]
			if !ok || target.h.Typeflag != tar.TypeReg {
				continue // a link to nothing the image holds
			}
			e = target
		}
		h := tar.Header{Typeflag: e.h.Typeflag, Name: n, Mode: src.Mode, Uid: src.Uid, Gid: src.Gid, Format: tar.FormatPAX, ModTime: time.Unix(0, 0)}
		switch h.Typeflag {
		case tar.TypeDir:
			h.Name += "/"
		case tar.TypeSymlink:
			h.Linkname = src.Linkname
		case tar.TypeReg:
			h.Size = e.h.Size
			if written += h.Size; written > maxBytes {
				return 0, fmt.Errorf("ociimage: the image's files, hard links copied, are larger than %d bytes", maxBytes)
			}
		}
		if err := tw.WriteHeader(&h); err != nil {
			return 0, fmt.Errorf("ociimage: write: %w", err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := io.Copy(tw, io.NewSectionReader(spool, e.off, h.Size)); err != nil {
				return 0, fmt.Errorf("ociimage: write: %w", err)
			}
		}
		count++
	}
	return count, tw.Close()
}
