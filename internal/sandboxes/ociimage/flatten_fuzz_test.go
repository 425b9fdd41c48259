package ociimage

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var zeroTime = time.Unix(0, 0)

// fuzzMaxBytes is the bound on file content FuzzFlattenTar flattens
// under: small, so that inputs reach it.
const fuzzMaxBytes = 4096

// tarOf is a tar of entries: a name ending in "/" is a directory, a
// "->target" body a symbolic link, a "=>target" body a hard link, "<fifo>"
// a FIFO, "<size N>" a regular file claiming N bytes it does not hold.
func tarOf(entries ...[2]string) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e[0], Mode: 0o4755}
		switch {
		case strings.HasSuffix(e[0], "/"):
			h.Typeflag = tar.TypeDir
		case strings.HasPrefix(e[1], "->"):
			h.Typeflag, h.Linkname = tar.TypeSymlink, e[1][2:]
		case strings.HasPrefix(e[1], "=>"):
			h.Typeflag, h.Linkname = tar.TypeLink, e[1][2:]
		case e[1] == "<fifo>":
			h.Typeflag = tar.TypeFifo
		case strings.HasPrefix(e[1], "<size "):
			h.Typeflag, h.Size = tar.TypeReg, 1<<40
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e[1]))
		}
		_ = tw.WriteHeader(h)
		if h.Typeflag == tar.TypeReg && h.Size == int64(len(e[1])) {
			_, _ = tw.Write([]byte(e[1]))
		}
	}
	_ = tw.Flush() // no end marker: a layer may be cut short
	return buf.Bytes()
}

// flattenSeeds are layers of the shapes Flatten must handle: files,
// directories and links, names that climb out or are absolute, devices,
// content over the bound, and hard links whose copies exceed it.
func flattenSeeds() [][]byte {
	big := strings.Repeat("x", fuzzMaxBytes/2+1)
	return [][]byte{
		tarOf([2]string{"bin/", ""}, [2]string{"bin/sh", "#!"}, [2]string{"bin/ls", "->sh"}, [2]string{"bin/ll", "=>bin/sh"}),
		tarOf([2]string{"../escape", "x"}, [2]string{"/abs", "y"}, [2]string{"a/../../b", "z"}, [2]string{"./", ""}),
		tarOf([2]string{"dev/null", "<fifo>"}, [2]string{"link", "=>missing"}, [2]string{"dir/", ""}, [2]string{"l2", "=>dir"}),
		tarOf([2]string{"huge", "<size 1T>"}),
		tarOf([2]string{"f", big}, [2]string{"g", "=>f"}, [2]string{"h", "=>/f"}),
		tarOf([2]string{"same", "one"}, [2]string{"same", "two"}, [2]string{"same/", ""}),
	}
}

// FuzzFlattenTar feeds arbitrary layer tars through Flatten's read and
// write (what mutate.Extract hands them). No input panics, and whatever it
// writes is a sandbox image tar: only regular files, directories and
// symbolic links, each under a clean relative name with no ".." element,
// in strictly increasing order, times zeroed, and file content, hard-link
// copies included, within the bound.
func FuzzFlattenTar(f *testing.F) {
	for _, s := range flattenSeeds() {
		f.Add(s)
	}
	// One spool for every input, emptied before each: a folder per input
	// (t.TempDir) costs more than the input.
	spool, err := os.CreateTemp(f.TempDir(), "spool")
	if err != nil {
		f.Fatal(err)
	}
	defer spool.Close()
	f.Fuzz(func(t *testing.T, raw []byte) {
		if err := spool.Truncate(0); err != nil {
			t.Fatal(err)
		}
		entries, st, err := read(tar.NewReader(bytes.NewReader(raw)), spool, fuzzMaxBytes)
		if err != nil {
			return
		}
		if st.Bytes > fuzzMaxBytes {
			t.Fatalf("read %d bytes over the bound", st.Bytes)
		}
		var out bytes.Buffer
		if _, err := write(&out, entries, spool, fuzzMaxBytes); err != nil {
			return
		}
		checkImageTar(t, out.Bytes())
	})
}

// checkImageTar fails t unless image is a sandbox image tar as Flatten
// promises it.
func checkImageTar(t *testing.T, image []byte) {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(image))
	var total int64
	prev := ""
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatalf("flattened tar does not read: %v", err)
		}
		name := strings.TrimSuffix(h.Name, "/")
		if name == "" || path.IsAbs(name) || path.Clean(name) != name || name == ".." || strings.HasPrefix(name, "../") ||
			filepath.IsAbs(name) || (h.Typeflag == tar.TypeDir) != strings.HasSuffix(h.Name, "/") {
			t.Fatalf("flattened tar has entry %q", h.Name)
		}
		if name <= prev {
			t.Fatalf("entry %q after %q", name, prev)
		}
		prev = name
		if !h.ModTime.Equal(zeroTime) {
			t.Fatalf("entry %q has time %v", name, h.ModTime)
		}
		switch h.Typeflag {
		case tar.TypeDir, tar.TypeSymlink:
		case tar.TypeReg:
			if total += h.Size; total > fuzzMaxBytes {
				t.Fatalf("flattened content %d bytes, over the bound", total)
			}
			if n, err := io.Copy(io.Discard, tr); err != nil || n != h.Size {
				t.Fatalf("entry %q holds %d of %d bytes (%v)", name, n, h.Size, err)
			}
		default:
			t.Fatalf("entry %q has type %q", name, string(h.Typeflag))
		}
	}
}
