package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/store"
)

// readmeBlock is one ```sh block of README.md, the line it starts on and
// the "## " section it is in.
type readmeBlock struct {
	line    int
	section string
	text    string
}

// stopDevSection is the README section that begins by stopping `dev` (its
// text tells the reader to, since it uses the same ports).
const stopDevSection = "A production-like install"

// readmeBlocks returns README.md's ```sh blocks in order.
func readmeBlocks(t *testing.T, path string) []readmeBlock {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []readmeBlock
	var cur *readmeBlock
	section := ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		l := sc.Text()
		switch {
		case cur == nil && strings.HasPrefix(l, "## "):
			section = strings.TrimPrefix(l, "## ")
		case cur == nil && strings.TrimSpace(l) == "```sh":
			cur = &readmeBlock{line: n + 1, section: section}
		case cur != nil && strings.TrimSpace(l) == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.text += l + "\n"
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Fatalf("README.md: the block at line %d is not closed", cur.line)
	}
	return out
}

// setupScript turns the README's first block, the two set-up commands, into
// what the test runs: `better-compute dev` exactly as written, in the
// background (it runs until stopped), and no `scripts/test` (which is what
// runs this test). Any other line there fails the test, so that a change
// to the set-up commands is a change to this test too.
func setupScript(t *testing.T, b readmeBlock) string {
	t.Helper()
	var s strings.Builder
	for _, l := range strings.Split(strings.TrimSpace(b.text), "\n") {
		cmd := strings.TrimSpace(strings.SplitN(l, "#", 2)[0])
		switch cmd {
		case "go run ./cmd/better-compute dev":
			s.WriteString("(cd \"$REPO\" && exec " + cmd + ") >\"$WORK/dev.log\" 2>&1 &\nDEV=$!\n")
			// Wait for dev's env file, which it writes once every node is
			// connected (a condition, polled, with a deadline).
			s.WriteString("for _ in $(seq 1 600); do [ -f \"$HOME/.better-compute/dev/env\" ] && break; kill -0 $DEV || { cat \"$WORK/dev.log\"; exit 1; }; sleep 0.2; done\n")
			s.WriteString("[ -f \"$HOME/.better-compute/dev/env\" ] || { echo 'dev did not become ready'; cat \"$WORK/dev.log\"; exit 1; }\n")
		case "scripts/test":
			s.WriteString(": scripts/test is the command that runs this test\n")
		default:
			t.Fatalf("README.md line %d: the set-up block holds %q, which this test does not know how to run", b.line, cmd)
		}
	}
	return s.String()
}

// TestREADMERunsAsWritten runs every ```sh block of README.md in order, in
// one bash with `set -euo pipefail`, as a newcomer would: a fresh HOME and
// working directory, the binaries built (here, and again by the README's
// own `go build`), PostgreSQL on its Unix socket for the production path. It runs in
// a network namespace of its own, so the README's default ports cannot
// collide with anything else on the machine; that needs root (CI has it).
func TestREADMERunsAsWritten(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	if os.Geteuid() != 0 {
		if os.Getenv("BC_REQUIRE_NETNS") == "1" {
			t.Fatal("BC_REQUIRE_NETNS=1 but not root: the README test needs a network namespace")
		}
		t.Skip("needs root for a network namespace (CI runs it)")
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	blocks := readmeBlocks(t, filepath.Join(repo, "README.md"))
	if len(blocks) < 2 {
		t.Fatalf("README.md has %d sh blocks", len(blocks))
	}
	work := t.TempDir()
	// A copy of the tree as a clone would have it (tracked files, and new
	// ones not ignored), where the README's blocks run as they would in
	// the reader's clone.
	clone := filepath.Join(work, "clone")
	copyTree(t, repo, clone)
	bin := filepath.Join(work, "bin")
	build := exec.Command("go", "build", "-o", bin+"/", "./cmd/...")
	build.Dir = repo
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	var script strings.Builder
	script.WriteString("set -euo pipefail\nip link set lo up\ncd \"$REPO\"\ntrap 'status=$?; set +e; for j in $(jobs -p); do pkill -INT -P $j; kill -INT $j; done 2>/dev/null; wait; exit $status' EXIT\n")
	script.WriteString(setupScript(t, blocks[0]))
	stopped := false
	for i, b := range blocks[1:] {
		if b.section == stopDevSection && !stopped {
			// The reader stops dev here, as the section says.
			// `go run` leaves the signal to its child, as a terminal's
			// Ctrl-C reaches both.
			script.WriteString("pkill -INT -P $DEV; wait $DEV || true\n")
			stopped = true
		}
		fmt.Fprintf(&script, "echo '== README.md block %d (line %d)'\n", i+2, b.line)
		script.WriteString(b.text)
	}
	if !stopped {
		t.Fatalf("README.md has no section %q", stopDevSection)
	}
	path := filepath.Join(work, "readme.sh")
	if err := os.WriteFile(path, []byte(script.String()), 0o700); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", "--net", "bash", "-x", path)
	cmd.WaitDelay = 5 * time.Second
	// Its own process group, so that whatever the README started is
	// stopped with it, however the run ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.Dir = work
	home := filepath.Join(work, "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	// The go command keeps its caches under HOME unless told: keep the
	// machine's, so `go run` in the README builds from them (the namespace
	// has no network).
	goenv, err := exec.Command("go", "env", "GOPATH", "GOMODCACHE", "GOCACHE").Output()
	if err != nil {
		t.Fatal(err)
	}
	g := strings.Fields(string(goenv))
	cmd.Env = append(os.Environ(), "HOME="+home, "WORK="+work, "REPO="+clone, "GOPATH="+g[0], "GOMODCACHE="+g[1], "GOCACHE="+g[2],
		"GOPROXY=off",
		"PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	readmeDatabase(t)
	// The script's output goes to a file, so that a hung step still shows
	// how far it got; bash -x names each command as it runs.
	logPath := filepath.Join(work, "readme.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	err = cmd.Run()
	logf.Close()
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // anything left behind
	if err != nil {
		out, _ := os.ReadFile(logPath)
		t.Fatalf("README.md does not run as written: %v\n%s", err, tail(string(out), 150))
	}
}

// readmeDatabase drops the database the README's production path makes
// (bc_readme, over the server's Unix socket: the test's network namespace
// has its own loopback), before the run and after it, so that the README
// can create it as a newcomer would.
func readmeDatabase(t *testing.T) {
	t.Helper()
	drop := func() error {
		admin, err := store.Open(context.Background(), "postgres://postgres@/postgres?host=/var/run/postgresql&sslmode=disable")
		if err != nil {
			return err
		}
		defer admin.Close()
		_, err = admin.ExecContext(context.Background(), "DROP DATABASE IF EXISTS bc_readme WITH (FORCE)")
		return err
	}
	if err := drop(); err != nil {
		t.Fatalf("the README's production path needs PostgreSQL on its Unix socket: %v", err)
	}
	t.Cleanup(func() { _ = drop() })
}

// copyTree copies the files git tracks under src, and the untracked ones
// it does not ignore, to dst.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	out, err := exec.Command("git", "-C", src, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	for _, rel := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		from := filepath.Join(src, rel)
		fi, err := os.Lstat(from)
		if os.IsNotExist(err) {
			continue // deleted in the working tree
		}
		if err != nil {
			t.Fatal(err)
		}
		to := filepath.Join(dst, rel)
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			target, err := os.Readlink(from)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, to); err != nil {
				t.Fatal(err)
			}
			continue
		}
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, b, fi.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
