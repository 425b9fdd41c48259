package checkpoint

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
)

// extractCounting runs extract on a compressed archive into a fresh
// directory and returns the extractor's counters and the error.
func extractCounting(t *testing.T, b []byte, lim Limits) (*extractor, error) {
	t.Helper()
	root, err := os.OpenRoot(emptyDir(t))
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	x, err := extract(context.Background(), bytes.NewReader(b), root, lim)
	if x == nil {
		t.Fatalf("extract did not start: %v", err)
	}
	return x, err
}

// TestZstdBombRefused: small archives that decompress far beyond
// MaxUnpackedBytes are refused checkpoint-too-large, and no more than the
// cap is written: one huge file (nothing written), many files (stops at
// the cap), and a stream of PAX padding with no file bytes at all (the
// decompressed-stream cap).
func TestZstdBombRefused(t *testing.T) {
	const limit = 1 << 20
	lim := Limits{MaxArchiveBytes: 1 << 20, MaxUnpackedBytes: limit, MaxEntries: 20}
	huge := make([]byte, 64<<20)
	one := compress(t, rawTar(t, ent{hdr: tar.Header{Name: "big", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(huge))}, body: huge}))
	var many []ent
	for i := 0; i < 16; i++ {
		many = append(many, ent{hdr: tar.Header{Name: "f" + strings.Repeat("x", i), Typeflag: tar.TypeReg, Mode: 0o644, Size: 300 << 10}, body: make([]byte, 300<<10)})
	}
	var pax []ent
	for i := 0; i < 20; i++ {
		pax = append(pax, ent{hdr: tar.Header{Name: "d" + strings.Repeat("x", i) + "/", Typeflag: tar.TypeDir, Mode: 0o755,
			PAXRecords: map[string]string{"comment": strings.Repeat("A", 500<<10)}}})
	}
	cases := map[string][]byte{"one-file": one, "many-files": compress(t, rawTar(t, many...)), "pax-padding": compress(t, rawTar(t, pax...))}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			if len(b) > 64<<10 {
				t.Fatalf("bomb is %d bytes compressed, want a small one", len(b))
			}
			x, err := extractCounting(t, b, lim)
			assertReason(t, err, ReasonTooLarge)
			if x.written > limit {
				t.Fatalf("wrote %d bytes, cap %d", x.written, limit)
			}
			dst, err := restore(t, b, lim)
			assertReason(t, err, ReasonTooLarge)
			assertEmpty(t, dst)
		})
	}
}
