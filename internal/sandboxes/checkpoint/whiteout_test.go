package checkpoint

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// requireRoot skips the test unless it runs as root (mknod, trusted.*
// attributes); with BC_REQUIRE_ROOT=1 (CI) it fails instead.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("BC_REQUIRE_ROOT") == "1" {
			t.Fatal("BC_REQUIRE_ROOT=1 but not root")
		}
		t.Skip("ROOT TEST NOT RUN: whiteouts need root (set BC_REQUIRE_ROOT=1 to make this fatal)")
	}
}

// whiteoutLayer is an overlay upper layer as the kernel leaves it after a
// tenant deleted /etc/gone and replaced /opt with a new directory: a
// whiteout (character device 0/0) and an opaque directory.
func whiteoutLayer(t *testing.T) string {
	t.Helper()
	src := layer(t)
	if err := unix.Mknod(filepath.Join(src, "etc", "gone"), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(src, "opt"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(filepath.Join(src, "opt"), opaqueXattr, []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	return src
}

// TestWhiteoutsRoundTrip: with Whiteouts, a whiteout and an opaque
// directory come back as exactly that; without, Pack refuses the
// whiteout as a device (and the attribute is not recorded).
func TestWhiteoutsRoundTrip(t *testing.T) {
	requireRoot(t)
	src := whiteoutLayer(t)
	var buf bytes.Buffer
	if _, err := Pack(context.Background(), src, &buf, DefaultLimits()); ReasonOf(err) != ReasonDevice {
		t.Fatalf("pack without whiteouts: %v, want %s", err, ReasonDevice)
	}
	lim := DefaultLimits()
	lim.Whiteouts = true
	buf.Reset()
	if _, err := Pack(context.Background(), src, &buf, lim); err != nil {
		t.Fatal(err)
	}
	dst, err := restore(t, buf.Bytes(), lim)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(dst, "etc", "gone"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Fatalf("etc/gone: mode %o rdev %d, want a 0/0 character device", st.Mode, st.Rdev)
	}
	b := make([]byte, 8)
	n, err := unix.Getxattr(filepath.Join(dst, "opt"), opaqueXattr, b)
	if err != nil || string(b[:n]) != "y" {
		t.Fatalf("opt opaque attribute %q %v, want y", b[:n], err)
	}
	if _, err := restore(t, buf.Bytes(), DefaultLimits()); ReasonOf(err) != ReasonDevice {
		t.Fatalf("materialize without whiteouts: %v, want %s", err, ReasonDevice)
	}
}

// TestWhiteoutsOnlyExactForm: with Whiteouts on, Materialize still
// refuses every device but a plain character device 0/0, and applies no
// attribute but the opaque mark.
func TestWhiteoutsOnlyExactForm(t *testing.T) {
	lim := testLimits()
	lim.Whiteouts = true
	cases := map[string]ent{
		"char-1-3":    {hdr: tar.Header{Name: "null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3, Mode: 0o666}},
		"char-0-1":    {hdr: tar.Header{Name: "z", Typeflag: tar.TypeChar, Devminor: 1}},
		"char-sticky": {hdr: tar.Header{Name: "s", Typeflag: tar.TypeChar, Mode: 0o1000}},
		"block-0-0":   {hdr: tar.Header{Name: "b", Typeflag: tar.TypeBlock}},
		"char-setuid": {hdr: tar.Header{Name: "u", Typeflag: tar.TypeChar, Mode: 0o4000}},
	}
	for name, e := range cases {
		t.Run(name, func(t *testing.T) {
			dst, err := restore(t, archive(t, append(prefix(), e)...), lim)
			if r := ReasonOf(err); r != ReasonDevice && r != ReasonSetID {
				t.Fatalf("reason %q (%v), want a device or set-id refusal", r, err)
			}
			assertEmpty(t, dst)
		})
	}
	t.Run("other-xattr-not-applied", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("trusted attributes need root")
		}
		d := dirEnt("d")
		d.hdr.PAXRecords = map[string]string{"SCHILY.xattr.trusted.overlay.redirect": "/etc", paxOpaque: "n"}
		dst, err := restore(t, archive(t, d), lim)
		if err != nil {
			t.Fatal(err)
		}
		sz, err := unix.Listxattr(filepath.Join(dst, "d"), nil)
		if err != nil || sz != 0 {
			t.Fatalf("attributes on d: %d bytes %v, want none", sz, err)
		}
	})
}
