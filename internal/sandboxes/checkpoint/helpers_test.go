package checkpoint

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// ent is one hand-built tar entry.
type ent struct {
	hdr  tar.Header
	body []byte
}

func dirEnt(name string) ent {
	return ent{hdr: tar.Header{Name: name + "/", Typeflag: tar.TypeDir, Mode: 0o755}}
}
func fileEnt(name, body string) ent {
	return ent{hdr: tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))}, body: []byte(body)}
}
func symEnt(name, target string) ent {
	return ent{hdr: tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777}}
}
func linkEnt(name, target string) ent {
	return ent{hdr: tar.Header{Name: name, Typeflag: tar.TypeLink, Linkname: target, Mode: 0o644}}
}

// rawTar writes entries with archive/tar, as an attacker could.
func rawTar(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := e.hdr
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("tar header %q: %v", h.Name, err)
		}
		if _, err := tw.Write(e.body); err != nil {
			t.Fatalf("tar body %q: %v", h.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// compress zstd-compresses b.
func compress(t testing.TB, b []byte, opts ...zstd.EOption) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, err := zstd.NewWriter(&buf, opts...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// archive is a hand-built checkpoint: entries tarred and compressed.
func archive(t testing.TB, ents ...ent) []byte { return compress(t, rawTar(t, ents...)) }

func digestOf(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// emptyDir makes a fresh empty target directory.
func emptyDir(t testing.TB) string {
	t.Helper()
	d := filepath.Join(t.TempDir(), "dst")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// restore materializes b under its own digest into a fresh directory.
func restore(t testing.TB, b []byte, lim Limits) (string, error) {
	t.Helper()
	dst := emptyDir(t)
	return dst, Materialize(context.Background(), bytes.NewReader(b), digestOf(b), dst, lim)
}

// assertEmpty fails unless dir exists and holds nothing.
func assertEmpty(t testing.TB, dir string) {
	t.Helper()
	names, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("read %s: %v", dir, err)
	}
	if len(names) != 0 {
		var got []string
		for _, n := range names {
			got = append(got, n.Name())
		}
		t.Fatalf("%s is not empty: %v", dir, got)
	}
}

// assertReason fails unless err is a refusal with reason want.
func assertReason(t testing.TB, err error, want string) {
	t.Helper()
	if got := ReasonOf(err); got != want {
		t.Fatalf("reason %q (err %v), want %q", got, err, want)
	}
}

// testLimits are small bounds for tests.
func testLimits() Limits {
	return Limits{MaxArchiveBytes: 1 << 20, MaxUnpackedBytes: 1 << 20, MaxEntries: 100}
}
