package sandbox

import (
	"archive/tar"
	"bytes"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

// unpackSeeds are image tars of the shapes Unpack must refuse or handle:
// a good image, names and links that climb out, devices, a hard link
// through a symbolic link, a file claiming more than the unpacked bound,
// and an archive cut short.
func unpackSeeds(f testing.TB) [][]byte {
	var out [][]byte
	add := func(hs ...*tar.Header) {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range hs {
			if err := tw.WriteHeader(h); err != nil {
				f.Fatal(err)
			}
			if h.Typeflag == tar.TypeReg && h.Size <= 64 {
				_, _ = tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
			}
		}
		_ = tw.Flush()
		out = append(out, buf.Bytes())
	}
	dir := func(n string) *tar.Header { return &tar.Header{Name: n, Typeflag: tar.TypeDir, Mode: 0o755} }
	reg := func(n string, mode, size int64) *tar.Header {
		return &tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: mode, Size: size}
	}
	link := func(n, to string, typ byte) *tar.Header { return &tar.Header{Name: n, Typeflag: typ, Linkname: to} }
	add(dir("bin/"), reg("bin/su", 0o6755, 2), link("bin/sh", "/bin/su", tar.TypeSymlink), link("bin/sh2", "bin/su", tar.TypeLink), dir("tmp/"))
	add(reg("/etc/passwd", 0o644, 1), reg("a/../../escape", 0o644, 1))
	add(link("out", "/", tar.TypeSymlink), reg("out/x", 0o644, 1))
	add(link("a/b", "..", tar.TypeSymlink), link("a/c", "b/../..", tar.TypeSymlink), reg("a/c/x", 0o644, 1))
	add(link("up", "../../etc", tar.TypeSymlink), link("h", "../etc/passwd", tar.TypeLink))
	add(reg("f", 0o644, 1), link("l", "f", tar.TypeSymlink), link("h", "l", tar.TypeLink))
	add(&tar.Header{Name: "dev/null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}, &tar.Header{Name: "p", Typeflag: tar.TypeFifo})
	add(reg("big", 0o644, MaxUnpackedBytes+1))
	add(reg("cut", 0o644, 64))
	return out
}

// FuzzUnpack feeds arbitrary image tars to the node's Unpack. Regular
// files declaring more than MaxUnpackedBytes in all are refused. Whatever
// the tar and whether Unpack refuses it or not: no input panics, nothing is
// written beside the root, and the root holds only directories, regular
// files and symbolic links, with no set-user-ID or set-group-ID bit, and
// every symbolic link's target, read lexically from the link's folder
// (an absolute one from the root), stays inside the root.
func FuzzUnpack(f *testing.F) {
	for _, s := range unpackSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		writes, over := declared(raw)
		if writes > 1<<20 {
			// A sparse entry may declare gigabytes that a tiny input
			// holds: within the bound, but too slow to write per input.
			return
		}
		parent := t.TempDir()
		root := filepath.Join(parent, "root")
		if err := os.Mkdir(root, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := Unpack(bytes.NewReader(raw), root); err == nil && over {
			t.Fatalf("unpacked regular files declaring more than %d bytes", int64(MaxUnpackedBytes))
		}
		if ents, _ := os.ReadDir(parent); len(ents) != 1 {
			t.Fatalf("written beside the root: %v", ents)
		}
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := os.Lstat(p)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			mode := fi.Mode()
			switch {
			case mode&(fs.ModeSetuid|fs.ModeSetgid) != 0:
				t.Fatalf("%s keeps mode %v", rel, mode)
			case mode&fs.ModeSymlink != 0:
				target, err := os.Readlink(p)
				if err != nil {
					return err
				}
				if !staysInside(filepath.ToSlash(rel), target) {
					t.Fatalf("symlink %s -> %s leaves the root", rel, target)
				}
			case !mode.IsDir() && !mode.IsRegular():
				t.Fatalf("%s has mode %v", rel, mode)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

// staysInside reports whether target, the target of a symbolic link at
// rel, names a path inside the root when read lexically: from the root if
// absolute, else from the link's folder, never climbing above the root.
func staysInside(rel, target string) bool {
	var at []string
	if !strings.HasPrefix(target, "/") && path.Dir(rel) != "." {
		at = strings.Split(path.Dir(rel), "/")
	}
	for _, el := range strings.Split(target, "/") {
		switch el {
		case "", ".":
		case "..":
			if len(at) == 0 {
				return false
			}
			at = at[:len(at)-1]
		default:
			at = append(at, el)
		}
	}
	return true
}

// declared reads raw's tar headers as Unpack meets them: writes is what
// its regular files would write before their sizes pass MaxUnpackedBytes,
// and over whether they pass it.
func declared(raw []byte) (writes int64, over bool) {
	tr := tar.NewReader(bytes.NewReader(raw))
	var total int64
	for {
		h, err := tr.Next()
		if err != nil {
			return writes, false
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		if total += h.Size; total > MaxUnpackedBytes {
			return writes, true
		}
		writes += h.Size
	}
}
