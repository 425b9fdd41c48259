package checkpoint

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// prefix is a valid start for every unsafe archive, so a refusal must
// also remove what was already extracted.
func prefix() []ent { return []ent{dirEnt("ok"), fileEnt("ok/f", "hello")} }

// TestMaterializeRefusesUnsafeEntries builds one archive per unsafe entry
// kind by hand and asserts the exact reason and that the target is left
// empty (the valid entries before the unsafe one are removed again).
func TestMaterializeRefusesUnsafeEntries(t *testing.T) {
	long := strings.Repeat("x", 256)
	cases := []struct {
		name   string
		ents   []ent
		reason string
	}{
		{"absolute", []ent{fileEnt("/etc/evil", "x")}, ReasonAbsolutePath},
		{"absolute-dir", []ent{dirEnt("/tmp")}, ReasonAbsolutePath},
		{"dotdot", []ent{fileEnt("../evil", "x")}, ReasonDotDot},
		{"dotdot-inner", []ent{fileEnt("ok/../../evil", "x")}, ReasonDotDot},
		{"dotdot-dir", []ent{dirEnt("ok/..")}, ReasonDotDot},
		{"symlink-up", []ent{symEnt("ok/l", "../../etc")}, ReasonLinkEscapes},
		{"symlink-up-top", []ent{symEnt("l", "..")}, ReasonLinkEscapes},
		{"symlink-absolute-up", []ent{symEnt("l", "/../etc")}, ReasonLinkEscapes},
		{"symlink-dotdot-after-name", []ent{symEnt("ok/up", ".."), dirEnt("ok/d"), symEnt("ok/d/m", "../up/..")}, ReasonLinkEscapes},
		{"symlink-empty", []ent{symEnt("l", "")}, ReasonLinkEscapes},
		{"hardlink-outside", []ent{linkEnt("h", "../outside")}, ReasonHardLink},
		{"hardlink-absolute", []ent{linkEnt("h", "/etc/passwd")}, ReasonHardLink},
		{"hardlink-to-dir", []ent{linkEnt("h", "ok")}, ReasonHardLink},
		{"hardlink-to-later", []ent{linkEnt("h", "later"), fileEnt("later", "x")}, ReasonHardLink},
		{"hardlink-to-symlink", []ent{symEnt("s", "ok/f"), linkEnt("h", "s")}, ReasonHardLink},
		{"char-device", []ent{{hdr: tar.Header{Name: "null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3, Mode: 0o666}}}, ReasonDevice},
		{"block-device", []ent{{hdr: tar.Header{Name: "sda", Typeflag: tar.TypeBlock, Devmajor: 8, Mode: 0o660}}}, ReasonDevice},
		{"fifo", []ent{{hdr: tar.Header{Name: "p", Typeflag: tar.TypeFifo, Mode: 0o644}}}, ReasonFIFO},
		{"other-type", []ent{{hdr: tar.Header{Name: "z", Typeflag: 'Z', Mode: 0o644}}}, ReasonOtherType},
		{"contiguous-type", []ent{{hdr: tar.Header{Name: "c", Typeflag: tar.TypeCont, Mode: 0o644}}}, ReasonOtherType},
		{"setuid", []ent{{hdr: tar.Header{Name: "su", Typeflag: tar.TypeReg, Mode: 0o4755}}}, ReasonSetID},
		{"setgid-dir", []ent{{hdr: tar.Header{Name: "sg/", Typeflag: tar.TypeDir, Mode: 0o2755}}}, ReasonSetID},
		{"mode-beyond-07777", []ent{{hdr: tar.Header{Name: "m", Typeflag: tar.TypeReg, Mode: 0o100644}}}, ReasonCorrupt},
		{"duplicate-file", []ent{fileEnt("ok/f", "again")}, ReasonDuplicate},
		{"duplicate-dir", []ent{dirEnt("ok")}, ReasonDuplicate},
		{"parent-missing", []ent{fileEnt("nodir/f", "x")}, ReasonParent},
		{"parent-is-file", []ent{fileEnt("ok/f/g", "x")}, ReasonParent},
		{"through-symlink", []ent{symEnt("s", "ok"), fileEnt("s/g", "x")}, ReasonParent},
		{"backslash", []ent{fileEnt(`a\b`, "x")}, ReasonBadName},
		{"dot-slash", []ent{fileEnt("./a", "x")}, ReasonBadName},
		{"dot-root", []ent{dirEnt(".")}, ReasonBadName},
		{"double-slash", []ent{fileEnt("ok//g", "x")}, ReasonBadName},
		{"element-too-long", []ent{fileEnt(long, "x")}, ReasonBadName},
		{"name-too-long", []ent{fileEnt(strings.Repeat("d/", 2100)+"f", "x")}, ReasonBadName},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dst, err := restore(t, archive(t, append(prefix(), c.ents...)...), testLimits())
			assertReason(t, err, c.reason)
			assertEmpty(t, dst)
		})
	}
}

// TestMaterializeRefusesCorrupt: bytes that are not a zstd tar, a cut
// stream, a frame whose checksum is missing or wrong, bytes after the
// tar's end (compressed or not) and a tar cut mid-file are refused
// checkpoint-corrupt, target empty.
func TestMaterializeRefusesCorrupt(t *testing.T) {
	good := archive(t, append(prefix(), fileEnt("ok/g", strings.Repeat("y", 5000)))...)
	tarCut := rawTar(t, append(prefix(), fileEnt("ok/g", strings.Repeat("y", 5000)))...)
	cases := map[string][]byte{
		"not-zstd":      []byte("this is not zstd"),
		"cut-zstd":      good[:len(good)-6],
		"no-sum":        good[:len(good)-4],
		"bad-sum":       append(bytes.Clone(good[:len(good)-1]), good[len(good)-1]^1),
		"trailing-junk": append(bytes.Clone(good), "junk"...),
		"trailing-data": compress(t, append(rawTar(t, prefix()...), "hidden"...)),
		"zstd-junk":     compress(t, []byte(strings.Repeat("not a tar header ", 64))),
		"cut-tar":       compress(t, tarCut[:2048]),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			dst, err := restore(t, b, testLimits())
			assertReason(t, err, ReasonCorrupt)
			assertEmpty(t, dst)
		})
	}
}

// TestMaterializeRefusesWideWindow: a zstd frame declaring a window over
// 8 MiB is refused before the decoder allocates it; one declaring exactly
// 8 MiB is accepted.
func TestMaterializeRefusesWideWindow(t *testing.T) {
	b := compress(t, rawTar(t, prefix()...), zstd.WithSingleSegment(false))
	if b[4]&0x20 != 0 {
		t.Fatalf("frame header % x has no window descriptor", b[:6])
	}
	at8, over := bytes.Clone(b), bytes.Clone(b)
	at8[5] = (23 - 10) << 3  // window log 23: 8 MiB
	over[5] = (26 - 10) << 3 // window log 26: 64 MiB
	if _, err := restore(t, at8, testLimits()); err != nil {
		t.Fatalf("8 MiB window refused: %v", err)
	}
	dst, err := restore(t, over, testLimits())
	assertReason(t, err, ReasonCorrupt)
	assertEmpty(t, dst)
}

// TestDigestMismatchWritesNothing: an archive that does not hash to the
// digest asked for is refused before anything is written into the target,
// even when it is a valid checkpoint; a malformed digest is refused before
// the source is read.
func TestDigestMismatchWritesNothing(t *testing.T) {
	good := archive(t, prefix()...)
	other := archive(t, fileEnt("x", "y"))
	dst := emptyDir(t)
	err := Materialize(context.Background(), bytes.NewReader(good), digestOf(other), dst, testLimits())
	assertReason(t, err, ReasonDigestMismatch)
	assertEmpty(t, dst)

	flipped := bytes.Clone(good)
	flipped[len(flipped)/2] ^= 1
	err = Materialize(context.Background(), bytes.NewReader(flipped), digestOf(good), dst, testLimits())
	assertReason(t, err, ReasonDigestMismatch)
	assertEmpty(t, dst)

	for _, d := range badDigests() {
		err := Materialize(context.Background(), failReader{t}, d, dst, testLimits())
		assertReason(t, err, ReasonBadDigest)
	}
	assertEmpty(t, dst)
}

// failReader fails the test when read.
type failReader struct{ t *testing.T }

func (f failReader) Read([]byte) (int, error) {
	f.t.Fatal("source read before the digest was checked")
	return 0, nil
}

// TestMaterializeRequiresEmptyTarget: a target holding anything is
// refused checkpoint-dir-not-empty and left as it was.
func TestMaterializeRequiresEmptyTarget(t *testing.T) {
	b := archive(t, prefix()...)
	dst := emptyDir(t)
	if err := os.WriteFile(filepath.Join(dst, "mine"), []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := Materialize(context.Background(), bytes.NewReader(b), digestOf(b), dst, testLimits())
	assertReason(t, err, ReasonNotEmpty)
	if got, err := os.ReadFile(filepath.Join(dst, "mine")); err != nil || string(got) != "keep" {
		t.Fatalf("target changed: %q %v", got, err)
	}
	if _, err := os.Lstat(filepath.Join(dst, "ok")); !os.IsNotExist(err) {
		t.Fatalf("archive extracted into a non-empty target: %v", err)
	}
}

// TestMaterializeCaps: the archive, entry and unpacked-size caps refuse
// with their reasons and leave the target empty.
func TestMaterializeCaps(t *testing.T) {
	b := archive(t, append(prefix(), fileEnt("ok/g", strings.Repeat("z", 100)))...)
	cases := []struct {
		name   string
		lim    Limits
		reason string
	}{
		{"archive", Limits{MaxArchiveBytes: int64(len(b)) - 1, MaxUnpackedBytes: 1 << 20, MaxEntries: 100}, ReasonTooLarge},
		{"entries", Limits{MaxArchiveBytes: 1 << 20, MaxUnpackedBytes: 1 << 20, MaxEntries: 2}, ReasonTooManyEntries},
		{"unpacked", Limits{MaxArchiveBytes: 1 << 20, MaxUnpackedBytes: 104, MaxEntries: 100}, ReasonTooLarge},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dst, err := restore(t, b, c.lim)
			assertReason(t, err, c.reason)
			assertEmpty(t, dst)
		})
	}
	exact := Limits{MaxArchiveBytes: int64(len(b)), MaxUnpackedBytes: 105, MaxEntries: 3}
	if _, err := restore(t, b, exact); err != nil {
		t.Fatalf("archive exactly at every cap refused: %v", err)
	}
}

// TestMaterializeHonoursContext: a cancelled context stops Materialize
// with the context's error and nothing in the target.
func TestMaterializeHonoursContext(t *testing.T) {
	b := archive(t, prefix()...)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dst := emptyDir(t)
	err := Materialize(ctx, bytes.NewReader(b), digestOf(b), dst, testLimits())
	if err == nil || ReasonOf(err) != "" || ctx.Err() == nil {
		t.Fatalf("err %v, want the context's", err)
	}
	assertEmpty(t, dst)
}
