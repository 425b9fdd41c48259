package hosthelper

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// Listen refuses a socket directory that is not root's, is writable by
// group or other, or is not a real directory, naming the rule.
func TestListenRefusesUnsafeSocketDir(t *testing.T) {
	base := openBase(t)
	mk := func(name string, mode os.FileMode, uid int) string {
		d := filepath.Join(base, name)
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, uid, 0); err != nil {
			t.Fatal(err)
		}
		return d
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(mk("target", 0o755, 0), link); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, dir string
		want      error
	}{
		{"group writable", mk("g", 0o775, 0), ErrDirWritable},
		{"other writable", mk("o", 0o757, 0), ErrDirWritable},
		{"sticky world writable", mk("s", 0o1777, 0), ErrDirWritable},
		{"owned by the node account", mk("n", 0o755, nodeUID), ErrDirOwner},
		{"a symlink", link, ErrDirNotDir},
		{"missing", filepath.Join(base, "missing"), ErrDirNotDir},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, err := Listen(filepath.Join(c.dir, "helper.sock"), 0, nodeGID)
			if err == nil {
				l.Close()
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("Listen: %v, want %v", err, c.want)
			}
		})
	}
}

// A symlink planted at the socket path cannot make root chmod or chown its
// target: the socket is set up in a private directory and renamed over the
// symlink, whose target keeps its mode and owner.
func TestListenDoesNotFollowPlantedSymlink(t *testing.T) {
	base := openBase(t)
	target := filepath.Join(base, "shadow")
	if err := os.WriteFile(target, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(base, "helper.sock")
	if err := os.Symlink(target, sock); err != nil {
		t.Fatal(err)
	}
	l, err := Listen(sock, 0, nodeGID)
	if err != nil {
		t.Fatal(err)
	}
	tfi, err := os.Stat(target)
	if err != nil {
		t.Fatal(err)
	}
	if st := tfi.Sys().(*syscall.Stat_t); tfi.Mode().Perm() != 0o600 || st.Uid != 0 || st.Gid != 0 {
		t.Fatalf("planted symlink's target changed: mode %v owner %d:%d", tfi.Mode().Perm(), st.Uid, st.Gid)
	}
	sfi, err := os.Lstat(sock)
	if err != nil {
		t.Fatal(err)
	}
	st := sfi.Sys().(*syscall.Stat_t)
	if sfi.Mode().Type() != fs.ModeSocket || sfi.Mode().Perm() != 0o660 || st.Uid != 0 || st.Gid != nodeGID {
		t.Fatalf("socket: %v owner %d:%d, want socket 0660 0:%d", sfi.Mode(), st.Uid, st.Gid, nodeGID)
	}
	if left, _ := filepath.Glob(filepath.Join(base, ".bind-*")); len(left) != 0 {
		t.Fatalf("private bind directories left behind: %v", left)
	}
	l.Close()
	if _, err := os.Lstat(sock); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("socket after Close: %v", err)
	}
}
