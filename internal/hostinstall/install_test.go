package hostinstall

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/bettercompute/bettercompute/internal/hosthelper/helperconfig"
	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
)

const testRoot = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

// needRoot skips a test that chowns files unless it runs as root; with
// BC_REQUIRE_ROOT=1 (CI) it fails instead.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("BC_REQUIRE_ROOT") == "1" {
		t.Fatal("BC_REQUIRE_ROOT=1 but not root: the install chowns files")
	}
	t.Skip("needs root to chown the installed files")
}

// installed installs into a fresh tree with a pinned root and this test
// binary as bcd, and returns the tree.
func installed(t *testing.T) string {
	t.Helper()
	needRoot(t)
	dir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Install(context.Background(), Options{Root: dir, CommandRootSHA256: []string{testRoot}, Bin: self}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// codes is the sorted set of finding codes.
func codes(fs []Finding) []string {
	set := map[string]bool{}
	for _, f := range fs {
		set[f.Code] = true
	}
	out := []string{}
	for c := range set {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}

// doctorCodes runs doctor on the tree.
func doctorCodes(t *testing.T, dir string) []string {
	t.Helper()
	fs := Doctor(context.Background(), DoctorOptions{Root: dir})
	for _, f := range fs {
		t.Log(f)
	}
	return codes(fs)
}

// wantMode checks a path's permission bits and owner.
func wantMode(t *testing.T, path string, mode os.FileMode, uid, gid int) {
	t.Helper()
	st, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	s := st.Sys().(*syscall.Stat_t)
	if st.Mode().Perm() != mode || int(s.Uid) != uid || int(s.Gid) != gid {
		t.Fatalf("%s: %04o %d:%d, want %04o %d:%d", path, st.Mode().Perm(), s.Uid, s.Gid, mode, uid, gid)
	}
}

// TestInstallWritesTheSeparatedLayout: the account has no supplementary
// group, no home and no shell; /etc/bcd and helper.toml are readable by
// the bcd group only and writable by root only; the node's data dir is
// bcd's alone, the helper's root's alone; and doctor finds nothing.
func TestInstallWritesTheSeparatedLayout(t *testing.T) {
	dir := installed(t)
	passwd, _ := os.ReadFile(filepath.Join(dir, "etc/passwd"))
	group, _ := os.ReadFile(filepath.Join(dir, "etc/group"))
	if string(passwd) != "bcd:x:999:999:Better Compute node agent:/nonexistent:/usr/sbin/nologin\n" || string(group) != "bcd:x:999:\n" {
		t.Fatalf("passwd %q group %q", passwd, group)
	}
	wantMode(t, filepath.Join(dir, ConfigDir), 0o750, 0, 999)
	wantMode(t, filepath.Join(dir, ConfigPath), 0o640, 0, 999)
	wantMode(t, filepath.Join(dir, NodeDataDir), 0o700, 999, 999)
	wantMode(t, filepath.Join(dir, HelperStateDir), 0o700, 0, 0)
	wantMode(t, filepath.Join(dir, NodeUnitPath), 0o644, 0, 0)
	wantMode(t, filepath.Join(dir, BinPath), 0o755, 0, 0)
	cfg, err := helperconfig.Load(filepath.Join(dir, ConfigPath))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg.CommandRootSHA256, []string{testRoot}) || len(cfg.ExeSHA256) != 1 {
		t.Fatalf("helper.toml pins: %+v", cfg)
	}
	if got := doctorCodes(t, dir); len(got) != 0 {
		t.Fatalf("doctor on a fresh install: %v", got)
	}
}

// TestInstallPicksAFreeSystemID: uid and gid are the highest number below
// 1000 that neither file uses, and the files' other lines stay.
func TestInstallPicksAFreeSystemID(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	pw := "root:x:0:0:root:/root:/bin/bash\nsvc:x:999:999::/:/usr/sbin/nologin"
	if err := os.WriteFile(filepath.Join(dir, "etc/passwd"), []byte(pw), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "etc/group"), []byte("root:x:0:\nsvc:x:999:\nother:x:998:\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Install(context.Background(), Options{Root: dir, CommandRootSHA256: []string{testRoot}}); err != nil {
		t.Fatal(err)
	}
	passwd, _ := os.ReadFile(filepath.Join(dir, "etc/passwd"))
	group, _ := os.ReadFile(filepath.Join(dir, "etc/group"))
	if !strings.HasSuffix(string(passwd), "\nbcd:x:997:997:Better Compute node agent:/nonexistent:/usr/sbin/nologin\n") ||
		!strings.HasPrefix(string(passwd), pw) || !strings.HasSuffix(string(group), "other:x:998:\nbcd:x:997:\n") {
		t.Fatalf("passwd %q\ngroup %q", passwd, group)
	}
}

// TestInstallIsIdempotent: a second run with the same options changes no
// byte, mode or owner, and says so for every path.
func TestInstallIsIdempotent(t *testing.T) {
	dir := installed(t)
	before := snapshot(t, dir)
	self, _ := os.Executable()
	r, err := Install(context.Background(), Options{Root: dir, CommandRootSHA256: []string{testRoot}, Bin: self})
	if err != nil {
		t.Fatal(err)
	}
	if r.Changed || len(r.Actions) != 8 {
		t.Fatalf("second run: %+v", r)
	}
	for _, a := range r.Actions {
		if a.Did != DidUnchanged {
			t.Fatalf("second run %s: %s", a.Path, a.Did)
		}
	}
	if after := snapshot(t, dir); !reflect.DeepEqual(before, after) {
		t.Fatalf("tree changed:\n%v\n%v", before, after)
	}
}

// snapshot is every path of the tree with its mode, owner and content.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.Walk(dir, func(p string, st os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		s := st.Sys().(*syscall.Stat_t)
		v := fmt.Sprintf("%s %d:%d %s", st.Mode(), s.Uid, s.Gid, st.ModTime())
		if st.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			v += string(b)
		}
		out[p] = v
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestUnitsPassSystemdAnalyzeVerify: systemd itself accepts both units,
// with the installed binary as their ExecStart (--root resolves it in the
// tree). A misspelt key or a bad value would fail here.
func TestUnitsPassSystemdAnalyzeVerify(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		if os.Getenv("BC_REQUIRE_ROOT") == "1" {
			t.Fatal("BC_REQUIRE_ROOT=1 but systemd-analyze is missing (.ci/run installs systemd)")
		}
		t.Skip("systemd-analyze is not installed")
	}
	dir := installed(t)
	out, err := exec.Command("systemd-analyze", "verify", "--root="+dir, "--man=no", "--recursive-errors=no",
		filepath.Join(dir, NodeUnitPath), filepath.Join(dir, HelperUnitPath)).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) != 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// TestDoctorFindsPlantedProblems plants one problem each in a fresh
// install and requires doctor to report exactly its code.
func TestDoctorFindsPlantedProblems(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, dir string)
		want  string
	}{
		{"world-writable directory", func(t *testing.T, dir string) { chmod(t, filepath.Join(dir, "var/lib"), 0o777) }, FindDirWritable},
		{"group-writable etc", func(t *testing.T, dir string) { chmod(t, filepath.Join(dir, "etc"), 0o775) }, FindDirWritable},
		{"node owns a directory on the way", func(t *testing.T, dir string) { chown(t, filepath.Join(dir, "etc/systemd"), 999) }, FindDirOwner},
		{"symlink on the way", func(t *testing.T, dir string) { symlinkDir(t, filepath.Join(dir, "var/lib/bcd-helper")) }, FindPathSymlink},
		{"bcd in disk", func(t *testing.T, dir string) { appendTo(t, filepath.Join(dir, "etc/group"), "disk:x:6:bcd\n") }, FindGroupRootEquiv},
		{"bcd in tss", func(t *testing.T, dir string) { appendTo(t, filepath.Join(dir, "etc/group"), "tss:x:105:other,bcd\n") }, FindGroupRootEquiv},
		{"bcd in a gid 0 group", func(t *testing.T, dir string) { appendTo(t, filepath.Join(dir, "etc/group"), "toor:x:0:bcd\n") }, FindGroupRootEquiv},
		{"bcd in another group", func(t *testing.T, dir string) { appendTo(t, filepath.Join(dir, "etc/group"), "audio:x:29:bcd\n") }, FindGroupSupplementary},
		{"another user in bcd", func(t *testing.T, dir string) {
			replaceIn(t, filepath.Join(dir, "etc/group"), "bcd:x:999:", "bcd:x:999:alice")
		}, FindGroupShared},
		{"bcd primary group root", func(t *testing.T, dir string) { replaceIn(t, filepath.Join(dir, "etc/passwd"), ":999:999:", ":999:0:") }, FindAccountRoot},
		{"bcd with a shell", func(t *testing.T, dir string) {
			replaceIn(t, filepath.Join(dir, "etc/passwd"), "/usr/sbin/nologin", "/bin/sh")
		}, FindAccountLogin},
		{"missing pin", func(t *testing.T, dir string) {
			replaceIn(t, filepath.Join(dir, ConfigPath), "command_root_sha256 = ['"+testRoot+"']\n", "")
		}, FindRootsUnpinned},
		{"helper.toml group-writable", func(t *testing.T, dir string) { chmod(t, filepath.Join(dir, ConfigPath), 0o660) }, FindFileWritable},
		{"bcd binary owned by the node", func(t *testing.T, dir string) { chown(t, filepath.Join(dir, BinPath), 999) }, FindFileWritable},
		{"unknown key in helper.toml", func(t *testing.T, dir string) { appendTo(t, filepath.Join(dir, ConfigPath), "roots = []\n") }, FindConfigInvalid},
		{"etc/bcd open to others", func(t *testing.T, dir string) { chmod(t, filepath.Join(dir, ConfigDir), 0o755) }, FindDirMode},
		{"node data dir root's", func(t *testing.T, dir string) { chown(t, filepath.Join(dir, NodeDataDir), 0) }, FindDirMode},
		{"unit missing", func(t *testing.T, dir string) { remove(t, filepath.Join(dir, HelperUnitPath)) }, FindUnitMissing},
		{"unit line removed", func(t *testing.T, dir string) {
			replaceIn(t, filepath.Join(dir, NodeUnitPath), "NoNewPrivileges=yes\n", "")
		}, FindUnitHardening},
		{"drop-in adds a capability", func(t *testing.T, dir string) {
			dropin(t, dir, "bcd.service.d", "[Service]\nCapabilityBoundingSet=CAP_NET_RAW\n")
		}, FindUnitHardening},
		{"drop-in runs as root", func(t *testing.T, dir string) { dropin(t, dir, "bcd.service.d", "[Service]\nUser=root\n") }, FindUnitHardening},
		{"drop-in adds a group", func(t *testing.T, dir string) { dropin(t, dir, "service.d", "[Service]\nSupplementaryGroups=disk\n") }, FindUnitForbidden},
		{"privileged ExecStartPre", func(t *testing.T, dir string) {
			dropin(t, dir, "bcd.service.d", "[Service]\nExecStartPre=+/bin/chown bcd /etc/bcd\n")
		}, FindUnitForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := installed(t)
			tc.plant(t, dir)
			if got := doctorCodes(t, dir); !reflect.DeepEqual(got, []string{tc.want}) {
				t.Fatalf("doctor = %v, want exactly [%s]", got, tc.want)
			}
		})
	}
}

func chmod(t *testing.T, p string, m os.FileMode) {
	t.Helper()
	if err := os.Chmod(p, m); err != nil {
		t.Fatal(err)
	}
}

func chown(t *testing.T, p string, uid int) {
	t.Helper()
	if err := os.Lchown(p, uid, -1); err != nil {
		t.Fatal(err)
	}
}

func remove(t *testing.T, p string) {
	t.Helper()
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
}

// symlinkDir moves a directory aside and puts a symlink to it in its place.
func symlinkDir(t *testing.T, p string) {
	t.Helper()
	if err := os.Rename(p, p+".real"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Base(p)+".real", p); err != nil {
		t.Fatal(err)
	}
}

func appendTo(t *testing.T, p, s string) {
	t.Helper()
	if err := appendLine(p, s, 0o644); err != nil {
		t.Fatal(err)
	}
}

// replaceIn replaces old (which must be there) with new in p, keeping
// its mode.
func replaceIn(t *testing.T, p, old, new string) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil || !strings.Contains(string(b), old) {
		t.Fatalf("%s: %v, or no %q in it", p, err, old)
	}
	if err := os.WriteFile(p, []byte(strings.Replace(string(b), old, new, 1)), 0); err != nil {
		t.Fatal(err)
	}
}

// dropin writes a drop-in override.conf under /etc/systemd/system/sub.
func dropin(t *testing.T, dir, sub, text string) {
	t.Helper()
	d := filepath.Join(dir, UnitDir, sub)
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "override.conf"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestInstallRefusesSymlinks: a symlink where the install makes a
// directory or writes a file is refused, so root's chown and chmod never
// follow one to another path.
func TestInstallRefusesSymlinks(t *testing.T) {
	for _, p := range []string{ConfigDir, NodeDataDir} {
		t.Run(p, func(t *testing.T) {
			needRoot(t)
			dir := t.TempDir()
			victim := filepath.Join(t.TempDir(), "victim")
			if err := os.Mkdir(victim, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(victim, filepath.Join(dir, p)); err != nil {
				t.Fatal(err)
			}
			_, err := Install(context.Background(), Options{Root: dir, CommandRootSHA256: []string{testRoot}})
			if err == nil || !strings.Contains(err.Error(), "not a directory") {
				t.Fatalf("install over a symlink: %v", err)
			}
			wantMode(t, victim, 0o755, 0, 0)
		})
	}
}

// TestInstallRefusesABadPin: a root pin that is not 32 bytes of hex is
// refused before anything is written.
func TestInstallRefusesABadPin(t *testing.T) {
	dir := t.TempDir()
	for pin, want := range map[string]error{"abcd": helperconfig.ErrLength, strings.Repeat("x", 64): helperconfig.ErrHex} {
		if _, err := Install(context.Background(), Options{Root: dir, CommandRootSHA256: []string{pin}}); !errors.Is(err, want) {
			t.Fatalf("pin %q: %v, want %v", pin, err, want)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("wrote %v", entries)
	}
}

// TestPingSpeaksTheWire: Ping sends one strict ping request, shuts its
// write half, and reads the helper's answer or refusal, over a real
// socket.
func TestPingSpeaksTheWire(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "helper.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	answers := []helperwire.Response{
		{Version: 1, Result: json.RawMessage(`{"version":1,"pid":7,"uid":0,"gid":0}`)},
		{Version: 1, Code: helperwire.CodePeerExe, Reason: "not bcd"},
	}
	done := make(chan helperwire.Request, len(answers))
	go func() {
		for _, a := range answers {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b, _ := io.ReadAll(c) // to EOF: the client shut its write half
			var req helperwire.Request
			dec := json.NewDecoder(strings.NewReader(string(b)))
			dec.DisallowUnknownFields()
			_ = dec.Decode(&req)
			done <- req
			out, _ := json.Marshal(a)
			_, _ = c.Write(out)
			c.Close()
		}
	}()
	p, err := Ping(context.Background(), sock)
	if err != nil || p.Version != 1 || p.PID != 7 {
		t.Fatalf("ping = %+v, %v", p, err)
	}
	if req := <-done; req.Version != helperwire.Version || req.Op != helperwire.OpPing {
		t.Fatalf("request = %+v", req)
	}
	_, err = Ping(context.Background(), sock)
	var ref *helperwire.Refusal
	if !errors.As(err, &ref) || ref.Code != helperwire.CodePeerExe {
		t.Fatalf("refused ping = %v, want %s", err, helperwire.CodePeerExe)
	}
}
