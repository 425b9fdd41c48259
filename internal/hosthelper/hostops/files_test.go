package hostops

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
)

// rootBase makes a root-owned 0755 directory whose ancestors pass the
// helper's walk: under /run, not t.TempDir(), because /tmp is
// world-writable (sticky or not, the helper refuses it).
func rootBase(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the helper's checks want root-owned directories")
	}
	dir, err := os.MkdirTemp("/run", "hostops-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// wantCode fails unless err is a *helperwire.Refusal with code.
func wantCode(t *testing.T, err error, code string) {
	t.Helper()
	var r *helperwire.Refusal
	if !errors.As(err, &r) || r.Code != code {
		t.Fatalf("got %v, want refusal %s", err, code)
	}
}

// testOps has bcd's default kinds under base, plus "nomk", a kind whose
// missing directory is not made.
func testOps(base string) *Ops {
	files := DefaultFiles(filepath.Join(base, "sshd"), filepath.Join(base, "sshd_config.d"))
	files["nomk"] = FileKind{Dir: filepath.Join(base, "nomk"), Name: "{id}.txt", Mode: 0o600}
	return &Ops{Files: files}
}

// TestWriteFileDefaultKinds: every default kind lands at the path
// sshca.WriteSSHDFiles (and sshd_config.d) uses, with its mode, root's;
// the sshd directories are made 0755; a second write replaces the
// content; no temp file is left; the defaults validate.
func TestWriteFileDefaultKinds(t *testing.T) {
	base := rootBase(t)
	if err := os.Mkdir(filepath.Join(base, "sshd_config.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	o := testOps(base)
	if err := o.ValidateFiles(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ kind, id, path string }{
		{KindSSHCA, "default", "sshd/trusted_user_ca_keys.pub"},
		{KindSSHKRL, "default", "sshd/revoked_keys.krl"},
		{KindSSHPrincipals, "alice", "sshd/principals/alice"},
		{KindSSHDDropin, "breakglass", "sshd_config.d/bcd-breakglass.conf"},
	} {
		for _, data := range []string{"first\n", "second\n"} {
			if err := o.WriteFile(c.kind, c.id, []byte(data)); err != nil {
				t.Fatalf("%s: %v", c.kind, err)
			}
			p := filepath.Join(base, c.path)
			got, err := os.ReadFile(p)
			if err != nil || string(got) != data {
				t.Fatalf("%s: read %q %v, want %q", p, got, err, data)
			}
			fi, _ := os.Lstat(p)
			if fi.Mode() != 0o644 || fi.Sys().(*syscall.Stat_t).Uid != 0 {
				t.Fatalf("%s: mode %v uid %d", p, fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid)
			}
		}
	}
	for _, d := range []string{"sshd", "sshd/principals"} {
		fi, err := os.Lstat(filepath.Join(base, d))
		if err != nil || fi.Mode() != fs.ModeDir|0o755 {
			t.Fatalf("%s: %v %v, want a 0755 directory", d, fi.Mode(), err)
		}
		entries, _ := os.ReadDir(filepath.Join(base, d))
		for _, e := range entries {
			if strings.Contains(e.Name(), ".tmp-") {
				t.Fatalf("temp file left: %s", e.Name())
			}
		}
	}
}

// TestWriteFileRefusesRequest: a kind not in the table, every bad id, an
// id on a fixed-name kind other than "default", and data over 1 MiB are
// refused by their exact codes, and nothing is written; exactly 1 MiB
// is written.
func TestWriteFileRefusesRequest(t *testing.T) {
	base := rootBase(t)
	o := testOps(base)
	wantCode(t, o.WriteFile("passwd", "x", nil), helperwire.CodeFileKind)
	wantCode(t, o.RemoveFile("", "x"), helperwire.CodeFileKind)
	for _, id := range []string{"", strings.Repeat("a", 65), "a/b", "..", "a..b", ".hidden", "a\x00b", "a b", "é", "a\n", "../../etc/passwd", "*"} {
		wantCode(t, o.WriteFile(KindSSHPrincipals, id, []byte("x")), helperwire.CodeFileID)
		wantCode(t, o.RemoveFile(KindSSHPrincipals, id), helperwire.CodeFileID)
	}
	wantCode(t, o.WriteFile(KindSSHCA, "other", []byte("x")), helperwire.CodeFileID)
	wantCode(t, o.WriteFile(KindSSHPrincipals, "bob", make([]byte, MaxFileSize+1)), helperwire.CodeFileTooLarge)
	if _, err := os.Lstat(filepath.Join(base, "sshd")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a refused write made %s/sshd: %v", base, err)
	}
	if err := o.WriteFile(KindSSHPrincipals, strings.Repeat("a", 64), make([]byte, MaxFileSize)); err != nil {
		t.Fatal(err)
	}
}

// TestWriteFileRefusesPath: a directory on the way that is a symlink,
// not a directory, not root's, group- or other-writable (sticky too), or
// a base under /tmp, is refused by its exact code, for write and remove.
func TestWriteFileRefusesPath(t *testing.T) {
	base := rootBase(t)
	real := filepath.Join(base, "real")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		setup func(p string) error
		code  string
	}{
		{"symlink", func(p string) error { return os.Symlink(real, p) }, helperwire.CodePathSymlink},
		{"file", func(p string) error { return os.WriteFile(p, nil, 0o644) }, helperwire.CodePathNotDir},
		{"owner", func(p string) error { return mkdirChown(p, 0o755, 65534) }, helperwire.CodePathOwner},
		{"world", func(p string) error { return mkdirChown(p, 0o777, 0) }, helperwire.CodePathWritable},
		{"group", func(p string) error { return mkdirChown(p, 0o775, 0) }, helperwire.CodePathWritable},
		{"sticky", func(p string) error { return mkdirChown(p, 0o777|fs.ModeSticky, 0) }, helperwire.CodePathWritable},
	} {
		t.Run(c.name, func(t *testing.T) {
			mid := filepath.Join(base, c.name)
			if err := c.setup(mid); err != nil {
				t.Fatal(err)
			}
			o := &Ops{Files: map[string]FileKind{
				"deep": {Dir: filepath.Join(mid, "d"), Name: "{id}", Mode: 0o644, MakeDirs: true},
				"at":   {Dir: mid, Name: "{id}", Mode: 0o644},
			}}
			for _, kind := range []string{"deep", "at"} {
				wantCode(t, o.WriteFile(kind, "f", []byte("x")), c.code)
				wantCode(t, o.RemoveFile(kind, "f"), c.code)
			}
			if _, err := os.Lstat(filepath.Join(real, "d")); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("a write through the symlink made a directory: %v", err)
			}
		})
	}
	tmp := t.TempDir() // under /tmp: mode 1777 on the way
	o := &Ops{Files: map[string]FileKind{"k": {Dir: tmp, Name: "{id}", Mode: 0o644}}}
	wantCode(t, o.WriteFile("k", "f", []byte("x")), helperwire.CodePathWritable)
}

// mkdirChown makes p with mode (chmod, past the umask) and owner uid.
func mkdirChown(p string, mode fs.FileMode, uid int) error {
	if err := os.Mkdir(p, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(p, mode); err != nil {
		return err
	}
	return os.Chown(p, uid, uid)
}

// TestSymlinkAtTargetLeavesItsTargetAlone: a symlink planted at a
// file's name, pointing at a passwd-like file, makes write and remove
// refuse with CodePathSymlink; the passwd file keeps its content and
// mode, and the symlink stays.
func TestSymlinkAtTargetLeavesItsTargetAlone(t *testing.T) {
	base := rootBase(t)
	passwd := filepath.Join(base, "passwd")
	want := []byte("root:x:0:0:root:/root:/bin/bash\n")
	if err := os.WriteFile(passwd, want, 0o600); err != nil {
		t.Fatal(err)
	}
	o := testOps(base)
	if err := o.WriteFile(KindSSHPrincipals, "alice", []byte("ok\n")); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "sshd", "principals", "mallory")
	if err := os.Symlink(passwd, link); err != nil {
		t.Fatal(err)
	}
	wantCode(t, o.WriteFile(KindSSHPrincipals, "mallory", []byte("mallory@node\n")), helperwire.CodePathSymlink)
	wantCode(t, o.RemoveFile(KindSSHPrincipals, "mallory"), helperwire.CodePathSymlink)
	got, err := os.ReadFile(passwd)
	fi, _ := os.Stat(passwd)
	if err != nil || !bytes.Equal(got, want) || fi.Mode() != 0o600 {
		t.Fatalf("passwd changed: %q %v %v", got, fi.Mode(), err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Fatalf("the symlink went: %v", err)
	}
}

// TestRemoveFile: a file is removed; removing it again, or from a
// directory that does not exist, is no error; a directory at the
// target is not removed.
func TestRemoveFile(t *testing.T) {
	base := rootBase(t)
	o := testOps(base)
	if err := o.WriteFile(KindSSHPrincipals, "alice", []byte("x")); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if err := o.RemoveFile(KindSSHPrincipals, "alice"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Lstat(filepath.Join(base, "sshd", "principals", "alice")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("not removed: %v", err)
	}
	if err := o.RemoveFile("nomk", "x"); err != nil {
		t.Fatalf("missing directory: %v", err)
	}
	if err := os.Mkdir(filepath.Join(base, "sshd", "principals", "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := o.RemoveFile(KindSSHPrincipals, "d"); err == nil {
		t.Fatal("removed a directory")
	}
	if err := o.WriteFile(KindSSHPrincipals, "d", []byte("x")); err == nil {
		t.Fatal("wrote over a directory")
	}
}

// TestMissingDirNotMade: a kind without MakeDirs fails (not a refusal
// code of the request) on a missing directory and makes nothing.
func TestMissingDirNotMade(t *testing.T) {
	base := rootBase(t)
	o := testOps(base)
	err := o.WriteFile("nomk", "x", []byte("x"))
	var r *helperwire.Refusal
	if err == nil || errors.As(err, &r) || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("got %v, want a not-exist failure", err)
	}
	if _, err := os.Lstat(filepath.Join(base, "nomk")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("made the directory: %v", err)
	}
}

// TestFileKindValidate: a relative or unclean directory, a name with a
// slash or two id tokens, a fixed name that is not a plain file name,
// and a group-writable or setuid mode are refused.
func TestFileKindValidate(t *testing.T) {
	for _, k := range []FileKind{
		{Dir: "etc", Name: "x", Mode: 0o644},
		{Dir: "/etc/../etc", Name: "x", Mode: 0o644},
		{Dir: "/etc", Name: "a/{id}", Mode: 0o644},
		{Dir: "/etc", Name: "{id}{id}", Mode: 0o644},
		{Dir: "/etc", Name: "..", Mode: 0o644},
		{Dir: "/etc", Name: "x", Mode: 0o664},
		{Dir: "/etc", Name: "x", Mode: 0o644 | fs.ModeSetuid},
	} {
		if k.Validate() == nil {
			t.Errorf("%+v validated", k)
		}
	}
}

// FuzzFileID: an id checkID accepts is one plain path component that
// cannot climb (no '/', NUL, "..", leading '.') and is at most 64 bytes.
func FuzzFileID(f *testing.F) {
	f.Fuzz(func(t *testing.T, id string) {
		if checkID(id) != nil {
			return
		}
		if len(id) > MaxFileID || strings.ContainsAny(id, "/\x00") || strings.Contains(id, "..") || id[0] == '.' || filepath.Base(id) != id {
			t.Fatalf("accepted %q", id)
		}
	})
}
