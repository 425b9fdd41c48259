package bcdcli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestInstallThenDoctor runs the commands as an operator would: install
// into a tree, doctor says ok and exits 0; a world-writable directory
// planted on the way to /etc/bcd makes doctor print its code and exit 1.
func TestInstallThenDoctor(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("BC_REQUIRE_ROOT") == "1" {
			t.Fatal("BC_REQUIRE_ROOT=1 but not root")
		}
		t.Skip("install chowns files: needs root")
	}
	dir := t.TempDir()
	run := func(args ...string) (int, string) {
		var out, errb bytes.Buffer
		code := Main(args, strings.NewReader(""), &out, &errb)
		return code, out.String() + errb.String()
	}
	pin := strings.Repeat("ab", 32)
	if code, out := run("install", "--unprivileged", "--root", dir, "--command-root-sha256", pin); code != 0 || !strings.Contains(out, "created   "+filepath.Join(dir, "etc/bcd/helper.toml")) {
		t.Fatalf("install: exit %d\n%s", code, out)
	}
	if code, out := run("install", "--unprivileged", "--root", dir, "--command-root-sha256", pin); code != 0 || !strings.HasSuffix(out, "no change: already installed\n") {
		t.Fatalf("second install: exit %d\n%s", code, out)
	}
	if code, out := run("doctor", "--root", dir); code != 0 || out != "ok: no finding\n" {
		t.Fatalf("doctor: exit %d\n%s", code, out)
	}
	if err := os.Chmod(filepath.Join(dir, "etc"), 0o777); err != nil {
		t.Fatal(err)
	}
	if code, out := run("doctor", "--root", dir); code != 1 || !strings.HasPrefix(out, "dir-writable: "+filepath.Join(dir, "etc")+": ") {
		t.Fatalf("doctor with /etc 0777: exit %d\n%s", code, out)
	}
	if code, out := run("install", "--root", dir); code != 2 {
		t.Fatalf("install without --unprivileged: exit %d\n%s", code, out)
	}
}
