package ociimage_test

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/bettercompute/bettercompute/internal/daemon/sandbox"
	"github.com/bettercompute/bettercompute/internal/sandboxes/ociimage"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// layer is a layer made of tar entries (a nil body is a directory,
// a "->target" body a symbolic link, a "=>target" body a hard link).
func layer(t *testing.T, files [][2]string) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f[0], Mode: 0o755}
		switch {
		case strings.HasSuffix(f[0], "/"):
			h.Typeflag = tar.TypeDir
		case strings.HasPrefix(f[1], "->"):
			h.Typeflag, h.Linkname = tar.TypeSymlink, f[1][2:]
		case strings.HasPrefix(f[1], "=>"):
			h.Typeflag, h.Linkname = tar.TypeLink, f[1][2:]
		case f[1] == "<fifo>":
			h.Typeflag = tar.TypeFifo
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f[1]))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			_, _ = tw.Write([]byte(f[1]))
		}
	}
	_ = tw.Close()
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// tinyImage has two layers: the upper one removes a file of the lower
// (a whiteout), replaces another, and adds links and a FIFO.
func tinyImage(t *testing.T) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image,
		layer(t, [][2]string{{"bin/", ""}, {"bin/hello", "#!/bin/sh\necho hello\n"}, {"etc/", ""}, {"etc/gone", "old"}, {"etc/motd", "v1"}}),
		layer(t, [][2]string{{"etc/.wh.gone", ""}, {"etc/motd", "v2"}, {"bin/hi", "->hello"}, {"bin/hello2", "=>bin/hello"}, {"run/pipe", "<fifo>"}}))
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// checkRootfs flattens img, unpacks it with the node's own unpacker and
// checks the tree the layers make.
func checkRootfs(t *testing.T, img v1.Image) {
	t.Helper()
	var out bytes.Buffer
	st, err := ociimage.Flatten(img, &out, spec.MaxImageBytes)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Skipped) != 1 || st.Skipped[0] != "run/pipe" {
		t.Fatalf("skipped %v, want the FIFO", st.Skipped)
	}
	var again bytes.Buffer
	if _, err := ociimage.Flatten(img, &again, spec.MaxImageBytes); err != nil || !bytes.Equal(out.Bytes(), again.Bytes()) {
		t.Fatalf("flatten is not deterministic (%v)", err)
	}
	dir := t.TempDir()
	if err := sandbox.Unpack(bytes.NewReader(out.Bytes()), dir); err != nil {
		t.Fatalf("the node refuses the image: %v", err)
	}
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if read("bin/hello") != "#!/bin/sh\necho hello\n" || read("bin/hello2") != read("bin/hello") || read("bin/hi") != read("bin/hello") {
		t.Fatal("bin/hello, its hard link or its symbolic link differ")
	}
	if read("etc/motd") != "v2" {
		t.Fatalf("etc/motd is %q, want the upper layer's", read("etc/motd"))
	}
	if _, err := os.Lstat(filepath.Join(dir, "etc/gone")); !os.IsNotExist(err) {
		t.Fatalf("a whited-out file is in the rootfs: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "bin/hello")); err != nil || fi.Mode()&0o111 == 0 {
		t.Fatalf("bin/hello is not executable: %v %v", fi, err)
	}
}

// TestFlattenOCILayout imports a tiny image from an OCI image layout
// directory (picked by its ref.name) into a rootfs the node unpacks.
func TestFlattenOCILayout(t *testing.T) {
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	img := tinyImage(t)
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "tiny"})); err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(empty.Image, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "other"})); err != nil {
		t.Fatal(err)
	}
	if _, err := ociimage.Open(dir, ""); err == nil || !strings.Contains(err.Error(), "tiny, other") {
		t.Fatalf("two images and no --ref: %v", err)
	}
	got, err := ociimage.Open(dir, "tiny")
	if err != nil {
		t.Fatal(err)
	}
	checkRootfs(t, got)
}

// TestFlattenDockerSave imports the same image from a `docker save`
// archive.
func TestFlattenDockerSave(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tiny.tar")
	tag, err := name.NewTag("example.com/tiny:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(file, tag, tinyImage(t)); err != nil {
		t.Fatal(err)
	}
	got, err := ociimage.Open(file, "")
	if err != nil {
		t.Fatal(err)
	}
	checkRootfs(t, got)
	if _, err := ociimage.Open(filepath.Join(t.TempDir()), ""); err == nil {
		t.Fatal("an empty directory opened as an image")
	}
}

// TestFlattenBounded: an image whose files pass the bound is refused.
func TestFlattenBounded(t *testing.T) {
	if _, err := ociimage.Flatten(tinyImage(t), io.Discard, 10); err == nil || !strings.Contains(err.Error(), "larger than 10 bytes") {
		t.Fatalf("flatten past the bound: %v", err)
	}
}

// Hard links are written as copies of their target, and the copies count
// against the bound: one 100-byte file with nine links fits in 100 bytes
// read but makes 1,000 bytes of tar content.
func TestFlattenBoundsHardLinkCopies(t *testing.T) {
	files := [][2]string{{"big", strings.Repeat("x", 100)}}
	for i := range 9 {
		files = append(files, [2]string{"link" + string(rune('0'+i)), "=>big"})
	}
	img, err := mutate.AppendLayers(empty.Image, layer(t, files))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ociimage.Flatten(img, io.Discard, 500); err == nil || !strings.Contains(err.Error(), "hard links copied") {
		t.Fatalf("flatten of links past the bound: %v", err)
	}
	if _, err := ociimage.Flatten(img, io.Discard, 1000); err != nil {
		t.Fatalf("flatten within the bound: %v", err)
	}
}
