package checkpoint

import (
	"archive/tar"
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// zstdMagic starts every zstd frame.
var zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}

// fuzzSeeds are valid and unsafe archives, raw tars (compressed by the
// target) and junk.
func fuzzSeeds(t testing.TB) [][]byte {
	return [][]byte{
		archive(t, prefix()...),
		rawTar(t, append(prefix(), symEnt("ok/l", "f"), linkEnt("ok/h", "ok/f"))...),
		rawTar(t, append(prefix(), symEnt("ok/l", "../../x"))...),
		rawTar(t, append(prefix(), fileEnt("../x", "y"))...),
		rawTar(t, append(prefix(), symEnt("s", "ok"), fileEnt("s/g", "x"))...),
		rawTar(t, ent{hdr: tar.Header{Name: "null", Typeflag: tar.TypeChar, Mode: 0o666}}),
		rawTar(t, ent{hdr: tar.Header{Name: "su", Typeflag: tar.TypeReg, Mode: 0o4755}}),
		[]byte("not an archive"),
	}
}

// FuzzMaterialize feeds arbitrary bytes to Materialize under their own
// digest, so extraction runs (input not starting with the zstd magic is
// compressed first, so the tar reader and the entry checks see the fuzzed
// bytes). It asserts that Materialize never panics, never writes outside
// its target (a sibling canary directory stays empty and nothing appears
// beside the two), refuses only with a known reason and then leaves the
// target empty, and on success leaves only directories, regular files and
// symbolic links without set-ID bits.
func FuzzMaterialize(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	lim := Limits{MaxArchiveBytes: 1 << 20, MaxUnpackedBytes: 1 << 20, MaxEntries: 64}
	f.Fuzz(func(t *testing.T, data []byte) {
		if !bytes.HasPrefix(data, zstdMagic) {
			data = compress(t, data)
		}
		base := t.TempDir()
		dst, canary := filepath.Join(base, "dst"), filepath.Join(base, "canary")
		for _, d := range []string{dst, canary} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		err := Materialize(context.Background(), bytes.NewReader(data), digestOf(data), dst, lim)
		assertEmpty(t, canary)
		if names, _ := os.ReadDir(base); len(names) != 2 {
			t.Fatalf("something appeared beside the target: %v", names)
		}
		if err != nil {
			if !slices.Contains(Reasons(), ReasonOf(err)) {
				t.Fatalf("not a refusal with a known reason: %v", err)
			}
			assertEmpty(t, dst)
			return
		}
		checkRestored(t, dst)
	})
}

// checkRestored fails on anything but directories, regular files and
// symbolic links, or on a set-ID bit, under dir.
func checkRestored(t *testing.T, dir string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		m := info.Mode()
		if m&(fs.ModeSetuid|fs.ModeSetgid) != 0 || (m.Type() != 0 && m.Type() != fs.ModeDir && m.Type() != fs.ModeSymlink) {
			t.Fatalf("%s restored with mode %v", p, m)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
