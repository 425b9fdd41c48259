package cli

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func wantContent(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil || string(got) != content {
		t.Fatalf("%s holds %q (%v), want %q", path, got, err, content)
	}
	st, err := os.Lstat(path)
	if err != nil || st.Mode().Perm() != mode {
		t.Fatalf("%s mode %v (%v), want %v", path, st.Mode().Perm(), err, mode)
	}
}

// writeOut creates a new file with exactly the mode asked for (whatever
// the umask), refuses an existing file or symlink (exit 1, naming --force)
// and leaves it as it was, and with force replaces it, taking the new mode
// even over a file that was open to others.
func TestWriteOutRefusesExistingFilesUnlessForced(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	dir := t.TempDir()
	path := filepath.Join(dir, "out")
	if err := writeOut(path, false, []byte("proof"), publicFileMode); err != nil {
		t.Fatal(err)
	}
	wantContent(t, path, "proof", 0o644)
	syscall.Umask(0)
	os.Remove(path)
	if err := writeOut(path, false, []byte("one"), secretFileMode); err != nil {
		t.Fatal(err)
	}
	wantContent(t, path, "one", 0o600)

	err := writeOut(path, false, []byte("two"), secretFileMode)
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Code != 1 || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("existing file: %v", err)
	}
	wantContent(t, path, "one", 0o600)

	link := filepath.Join(dir, "link")
	if err := os.Symlink(filepath.Join(dir, "elsewhere"), link); err != nil {
		t.Fatal(err)
	}
	if err := writeOut(link, false, []byte("x"), secretFileMode); !errors.As(err, &ee) || ee.Code != 1 {
		t.Fatalf("dangling symlink: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "elsewhere")); !os.IsNotExist(err) {
		t.Fatal("writeOut followed a symlink")
	}

	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := writeOut(path, true, []byte("three"), secretFileMode); err != nil {
		t.Fatal(err)
	}
	wantContent(t, path, "three", 0o600)
	if entries, _ := os.ReadDir(dir); len(entries) != 2 {
		t.Fatalf("temp files left behind: %v", entries)
	}

	// --force replaces a file, never a directory: refused when the file is
	// reserved, before a command mints what it would hold.
	sub := filepath.Join(dir, "adir")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := openOut(sub, true, secretFileMode); !errors.As(err, &ee) || ee.Code != 1 || !strings.Contains(err.Error(), "is not a file") {
		t.Fatalf("--force over a directory: %v", err)
	}
}

// An aborted reservation gives the name back; a force reservation leaves
// the existing file as it was until Commit.
func TestOutFileAbort(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "k")
	o, err := openOut(path, false, secretFileMode)
	if err != nil {
		t.Fatal(err)
	}
	o.Abort()
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Fatalf("abort left %s: %v", path, err)
	}
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err = openOut(path, true, secretFileMode)
	if err != nil {
		t.Fatal(err)
	}
	o.Abort()
	wantContent(t, path, "old", 0o600)
}

// Every command with an --out file refuses an existing one before it
// calls the API or mints anything (the API address here answers nothing),
// and leaves it as it was; the directory --outs (approvers init, pki
// issue-gateway) refuse files already there.
func TestEveryOutRefusesAnExistingFile(t *testing.T) {
	t.Setenv("BC_ADDR", "http://127.0.0.1:1")
	t.Setenv("BC_API_KEY", "bck_x")
	dir := t.TempDir()
	existing := filepath.Join(dir, "existing")
	if err := os.WriteFile(existing, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "approver-1.key"), []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "gateway.key"), []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	kek := filepath.Join(dir, "kek")
	pkiDir := filepath.Join(dir, "pki")
	var out, errb bytes.Buffer
	if code := Main([]string{"pki", "init", "--dir", pkiDir, "--kek-file", kek}, &out, &errb); code != 0 {
		t.Fatalf("pki init: %d %s", code, errb.String())
	}
	for _, args := range [][]string{
		{"api-keys", "create", "--identity", "admin", "--out", existing},
		{"join-tokens", "create", "--out", existing},
		{"commands", "attestation", "c_x", "--out", existing},
		{"audit", "prove", "--db", "sqlite:" + filepath.Join(dir, "none.db"), "--tenant", "t", "--event", "ev_x", "--out", existing},
		{"approvers", "init", "--out", dir},
		{"pki", "issue-gateway", "--pki", pkiDir, "--kek-file", kek, "--out", dir},
	} {
		out.Reset()
		errb.Reset()
		code := Main(args, &out, &errb)
		if code != 1 || !strings.Contains(errb.String(), "--force") {
			t.Errorf("%v: exit %d: %s", args, code, errb.String())
		}
	}
	for _, f := range []string{existing, filepath.Join(dir, "approver-1.key"), filepath.Join(dir, "gateway.key")} {
		wantContent(t, f, "keep", 0o600)
	}
}
