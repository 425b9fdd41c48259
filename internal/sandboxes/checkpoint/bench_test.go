package checkpoint

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// benchLayer writes a ~16 MiB layer of mixed files: text (compressible),
// random binaries (not), many small configs, a zero-filled file, nested
// directories and symbolic links.
func benchLayer(b *testing.B) string {
	b.Helper()
	src := filepath.Join(b.TempDir(), "layer")
	rng := rand.New(rand.NewPCG(1, 2))
	write := func(name string, body []byte) {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(p, body, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	words := strings.Fields("the quick sandbox writes its layer and the checkpoint keeps every byte of it safe")
	for i := 0; i < 200; i++ { // 8 MiB of text
		var sb strings.Builder
		for sb.Len() < 40<<10 {
			sb.WriteString(words[rng.IntN(len(words))])
			sb.WriteByte(" \n"[rng.IntN(2)])
		}
		write(fmt.Sprintf("usr/share/doc/p%03d/README", i), []byte(sb.String()[:40<<10]))
	}
	for i := 0; i < 8; i++ { // 4 MiB of random binaries
		bin := make([]byte, 512<<10)
		for j := range bin {
			bin[j] = byte(rng.Uint32())
		}
		write(fmt.Sprintf("usr/lib/lib%d.so", i), bin)
	}
	for i := 0; i < 2000; i++ { // 2 MiB of small files
		write(fmt.Sprintf("etc/conf.d/%02d/c%04d.conf", i%40, i), []byte(strings.Repeat(fmt.Sprintf("key%d = value%d\n", i, i), 128)[:1024]))
	}
	write("var/lib/db.img", make([]byte, 2<<20))
	for i := 0; i < 50; i++ {
		if err := os.Symlink(fmt.Sprintf("../lib/lib%d.so", i%8), filepath.Join(src, "usr/lib", fmt.Sprintf("alias%02d.so", i))); err != nil {
			b.Fatal(err)
		}
	}
	return src
}

// plainTar is the baseline: the same tree as an uncompressed tar, written
// with archive/tar and no checks. It returns the tar's size.
func plainTar(dir string, w io.Writer) (int64, error) {
	cw := &hashCounter{w: w, h: nopHash{}, max: 1 << 62}
	tw := tar.NewWriter(cw)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		h.Name, _ = filepath.Rel(dir, p)
		if err := tw.WriteHeader(h); err != nil || !info.Mode().IsRegular() {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err == nil {
		err = tw.Close()
	}
	return cw.n, err
}

// nopHash is a hash.Hash that does nothing, for the baseline's counter.
type nopHash struct{}

func (nopHash) Write(p []byte) (int, error) { return len(p), nil }
func (nopHash) Sum(b []byte) []byte         { return b }
func (nopHash) Reset()                      {}
func (nopHash) Size() int                   { return 0 }
func (nopHash) BlockSize() int              { return 1 }

// BenchmarkPackMaterialize packs and materializes a ~16 MiB layer of mixed
// files, beside a plain uncompressed tar of the same tree as the baseline;
// "archive/tar" reports the checkpoint's size over the plain tar's.
func BenchmarkPackMaterialize(b *testing.B) {
	src := benchLayer(b)
	ctx := context.Background()
	tarSize, err := plainTar(src, io.Discard)
	if err != nil {
		b.Fatal(err)
	}
	var packed bytes.Buffer
	info, err := Pack(ctx, src, &packed, DefaultLimits())
	if err != nil {
		b.Fatal(err)
	}
	b.Run("tar-baseline", func(b *testing.B) {
		b.SetBytes(info.Bytes)
		for i := 0; i < b.N; i++ {
			if _, err := plainTar(src, io.Discard); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(tarSize), "archive-bytes")
	})
	b.Run("pack", func(b *testing.B) {
		b.SetBytes(info.Bytes)
		for i := 0; i < b.N; i++ {
			if _, err := Pack(ctx, src, io.Discard, DefaultLimits()); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(info.Size), "archive-bytes")
		b.ReportMetric(float64(info.Size)/float64(tarSize), "archive/tar")
	})
	b.Run("materialize", func(b *testing.B) {
		b.SetBytes(info.Bytes)
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			dst := filepath.Join(b.TempDir(), "dst")
			if err := os.Mkdir(dst, 0o755); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			if err := Materialize(ctx, bytes.NewReader(packed.Bytes()), info.Digest, dst, DefaultLimits()); err != nil {
				b.Fatal(err)
			}
		}
	})
}
