package checkpoint

import (
	"bytes"
	"context"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// layer builds a source tree with files, directories (an empty one, a
// read-only one, a sticky one), symbolic links inside it (relative and
// rooted) and a hard link, with varied modes.
func layer(t testing.TB) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "src")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"", "etc", "usr/bin", "empty", "tmp", "ro"} {
		must(os.MkdirAll(filepath.Join(src, d), 0o755))
	}
	files := map[string]fs.FileMode{"etc/conf": 0o644, "usr/bin/tool": 0o755, "secret": 0o600, "ro/r": 0o400, "blank": 0o640}
	for name, mode := range files {
		body := strings.Repeat(name+"\n", len(name)*7)
		if name == "blank" {
			body = ""
		}
		must(os.WriteFile(filepath.Join(src, name), []byte(body), 0o600))
		must(os.Chmod(filepath.Join(src, name), mode))
	}
	must(os.Link(filepath.Join(src, "etc/conf"), filepath.Join(src, "usr/conf-hard")))
	must(os.Symlink("../etc/conf", filepath.Join(src, "usr/conf-rel")))
	must(os.Symlink("/usr/bin/tool", filepath.Join(src, "tool-rooted")))
	must(os.Symlink("missing", filepath.Join(src, "dangling")))
	must(os.Chmod(filepath.Join(src, "empty"), 0o750))
	must(os.Chmod(filepath.Join(src, "tmp"), 0o777|fs.ModeSticky))
	must(os.Chmod(filepath.Join(src, "ro"), 0o555))
	return src
}

// snapshot describes a tree: per name its type, mode, content or target.
func snapshot(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		desc := info.Mode().String()
		switch {
		case info.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			desc += " " + string(b)
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			desc += " -> " + target
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestRoundTrip: Pack then Materialize gives the same tree: files with
// their bytes and modes, directories (empty, read-only, sticky) with
// theirs, symbolic links with their targets, and the hard link as a hard
// link; Info counts what was packed.
func TestRoundTrip(t *testing.T) {
	src := layer(t)
	var buf bytes.Buffer
	info, err := Pack(context.Background(), src, &buf, DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	if info.Digest != digestOf(buf.Bytes()) || info.Size != int64(buf.Len()) || info.Entries != 15 {
		t.Fatalf("info %+v, archive %d bytes %s", info, buf.Len(), digestOf(buf.Bytes()))
	}
	dst := emptyDir(t)
	if err := Materialize(context.Background(), bytes.NewReader(buf.Bytes()), info.Digest, dst, DefaultLimits()); err != nil {
		t.Fatal(err)
	}
	want, got := snapshot(t, src), snapshot(t, dst)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: got %q, want %q", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("got %d entries, want %d", len(got), len(want))
	}
	a, _ := os.Stat(filepath.Join(dst, "etc/conf"))
	b, _ := os.Stat(filepath.Join(dst, "usr/conf-hard"))
	if a == nil || b == nil || !os.SameFile(a, b) {
		t.Error("hard link not restored as a hard link")
	}
	var again bytes.Buffer
	if info2, err := Pack(context.Background(), dst, &again, DefaultLimits()); err != nil || info2 != info {
		t.Errorf("repacking the restored tree: %+v %v, want %+v (deterministic)", info2, err, info)
	}
}

// TestPackRefuses: Pack refuses a source Materialize would refuse, with
// the same reasons.
func TestPackRefuses(t *testing.T) {
	cases := []struct {
		name   string
		make   func(t *testing.T, src string) error
		reason string
	}{
		{"fifo", func(_ *testing.T, src string) error { return syscall.Mkfifo(filepath.Join(src, "p"), 0o644) }, ReasonFIFO},
		{"socket", func(t *testing.T, src string) error {
			l, err := net.Listen("unix", filepath.Join(src, "s"))
			if err == nil {
				t.Cleanup(func() { l.Close() })
			}
			return err
		}, ReasonOtherType},
		{"device", func(t *testing.T, src string) error {
			if os.Geteuid() != 0 {
				t.Skip("mknod needs root")
			}
			return syscall.Mknod(filepath.Join(src, "null"), syscall.S_IFCHR|0o666, 1<<8|3)
		}, ReasonDevice},
		{"setuid", func(_ *testing.T, src string) error { return chmodFile(src, "su", 0o755|fs.ModeSetuid) }, ReasonSetID},
		{"setgid", func(_ *testing.T, src string) error { return chmodFile(src, "sg", 0o755|fs.ModeSetgid) }, ReasonSetID},
		{"symlink-escapes", func(_ *testing.T, src string) error { return os.Symlink("../../etc", filepath.Join(src, "etc/out")) }, ReasonLinkEscapes},
		{"backslash", func(_ *testing.T, src string) error { return os.WriteFile(filepath.Join(src, `a\b`), nil, 0o644) }, ReasonBadName},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := layer(t)
			if err := c.make(t, src); err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			_, err := Pack(context.Background(), src, &buf, DefaultLimits())
			assertReason(t, err, c.reason)
		})
	}
}

func chmodFile(src, name string, mode fs.FileMode) error {
	p := filepath.Join(src, name)
	if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
		return err
	}
	return os.Chmod(p, mode)
}

// TestPackCaps: Pack refuses a tree over the entry, unpacked or archive
// cap, so it never writes a checkpoint Materialize would refuse.
func TestPackCaps(t *testing.T) {
	src := layer(t)
	cases := []struct {
		name   string
		lim    Limits
		reason string
	}{
		{"entries", Limits{MaxArchiveBytes: 1 << 20, MaxUnpackedBytes: 1 << 20, MaxEntries: 14}, ReasonTooManyEntries},
		{"unpacked", Limits{MaxArchiveBytes: 1 << 20, MaxUnpackedBytes: 100, MaxEntries: 100}, ReasonTooLarge},
		{"archive", Limits{MaxArchiveBytes: 100, MaxUnpackedBytes: 1 << 20, MaxEntries: 100}, ReasonTooLarge},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Pack(context.Background(), src, &bytes.Buffer{}, c.lim)
			assertReason(t, err, c.reason)
		})
	}
}
