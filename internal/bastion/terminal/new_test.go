package terminal

import (
	"os"
	"path/filepath"
	"testing"
)

// TestNewTranscriptsDir: New makes Dir/transcripts 0700, tightens an
// existing looser one, and refuses a symlink or a file in its place or a
// relative shell.
func TestNewTranscriptsDir(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "transcripts"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Dir: dir}); err != nil {
		t.Fatalf("New: %v", err)
	}
	checkMode(t, filepath.Join(dir, "transcripts"), 0o700)

	link := t.TempDir()
	if err := os.Symlink(t.TempDir(), filepath.Join(link, "transcripts")); err != nil {
		t.Fatal(err)
	}
	file := t.TempDir()
	if err := os.WriteFile(filepath.Join(file, "transcripts"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]Config{
		"symlink":        {Dir: link},
		"file":           {Dir: file},
		"no-dir":         {},
		"relative-shell": {Dir: t.TempDir(), Shell: "sh"},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: New succeeded", name)
		}
	}
}

// TestDefaultShell: $SHELL only when it is an absolute executable.
func TestDefaultShell(t *testing.T) {
	dir := t.TempDir()
	exe, plain := filepath.Join(dir, "myshell"), filepath.Join(dir, "notexec")
	if os.WriteFile(exe, nil, 0o755) != nil || os.WriteFile(plain, nil, 0o644) != nil {
		t.Fatal("cannot write the test files")
	}
	for env, want := range map[string]string{
		exe:                exe,
		"myshell":          "/bin/sh",
		plain:              "/bin/sh",
		dir:                "/bin/sh",
		"/nonexistent/zsh": "/bin/sh",
		"":                 "/bin/sh",
	} {
		if got := defaultShell(env); got != want {
			t.Errorf("defaultShell(%q) = %q, want %q", env, got, want)
		}
	}
}
