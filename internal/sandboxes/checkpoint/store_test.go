package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// badDigests are digest strings that must never become a key.
func badDigests() []string {
	h := strings.Repeat("ab", 32)
	return []string{
		"", "sha256:", h, "sha256:" + h[:63], "sha256:" + h + "0", "sha256:" + strings.ToUpper(h),
		"sha512:" + h, "SHA256:" + h, "sha256:../../../../etc/passwd", "sha256:" + h[:60] + "/../",
		"sha256:" + h[:62] + "/x", "sha256:" + h[:63] + "\x00", " sha256:" + h, "sha256:" + h + "\n",
	}
}

// TestStoreRoundTrip: a checkpoint put into a folder store (created 0700)
// is found under its digest, restores through Materialize, is stored once
// however often it is put, and after Delete is ErrNotFound.
func TestStoreRoundTrip(t *testing.T) {
	ctx := context.Background()
	folder := filepath.Join(t.TempDir(), "store")
	s, err := OpenStore(ctx, folder)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if fi, err := os.Stat(folder); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("store folder: %v %v", fi, err)
	}
	var buf bytes.Buffer
	packed, err := Pack(ctx, layer(t), &buf, DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		info, err := s.Put(ctx, bytes.NewReader(buf.Bytes()))
		if err != nil || info.Digest != packed.Digest || info.Size != packed.Size {
			t.Fatalf("put: %+v %v, want %s", info, err, packed.Digest)
		}
	}
	if _, err := os.Stat(filepath.Join(folder, "checkpoints/sha256", packed.Digest[7:])); err != nil {
		t.Fatalf("object not under its key: %v", err)
	}
	if ok, err := s.Exists(ctx, packed.Digest); !ok || err != nil {
		t.Fatalf("exists: %v %v", ok, err)
	}
	r, err := s.Open(ctx, packed.Digest)
	if err != nil {
		t.Fatal(err)
	}
	dst := emptyDir(t)
	err = Materialize(ctx, r, packed.Digest, dst, DefaultLimits())
	r.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, packed.Digest); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Open(ctx, packed.Digest); !errors.Is(err, ErrNotFound) {
		t.Fatalf("open after delete: %v, want ErrNotFound", err)
	}
	if err := s.Delete(ctx, packed.Digest); !errors.Is(err, ErrNotFound) {
		t.Fatalf("delete after delete: %v, want ErrNotFound", err)
	}
	if ok, err := s.Exists(ctx, packed.Digest); ok || err != nil {
		t.Fatalf("exists after delete: %v %v", ok, err)
	}
}

// TestStoreFileURL: a file:// URL opens the same kind of store.
func TestStoreFileURL(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, err := OpenStore(ctx, "file://"+dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	info, err := s.Put(ctx, strings.NewReader("bytes"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.Open(ctx, info.Digest)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if b, _ := io.ReadAll(r); string(b) != "bytes" || info.Digest != digestOf([]byte("bytes")) {
		t.Fatalf("got %q under %s", b, info.Digest)
	}
}

// TestStoreRefusesBadDigests: a digest that is not exactly
// "sha256:<64 lower-case hex>" (path tricks, other algorithms, case,
// length, NUL, whitespace) is refused checkpoint-bad-digest by Open,
// Exists and Delete before any key is built, and nothing outside the
// store folder is touched.
func TestStoreRefusesBadDigests(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	s, err := OpenStore(ctx, filepath.Join(base, "store"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	victim := filepath.Join(base, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, d := range badDigests() {
		_, err := s.Open(ctx, d)
		assertReason(t, err, ReasonBadDigest)
		_, err = s.Exists(ctx, d)
		assertReason(t, err, ReasonBadDigest)
		assertReason(t, s.Delete(ctx, d), ReasonBadDigest)
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != "keep" {
		t.Fatalf("victim touched: %q %v", b, err)
	}
}
