package plugin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/bettercompute/bettercompute/internal/daemon/driver"
)

// testBin is a copy of this test binary in a 0755 directory, so a plugin's
// own uid can execute it: it plays bcd (the shim) and the plugins.
var testBin, testBinSHA string

// TestMain makes the test binary three things: the shim when started as
// `__bcx-exec`, a test plugin when BCX_PLUGIN_TEST_MODE is set, and the
// tests otherwise.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == ShimCommand {
		err := ShimMain(os.Args[2:], os.Environ())
		fmt.Fprintln(os.Stderr, "shim:", err)
		os.Exit(111)
	}
	if mode := os.Getenv("BCX_PLUGIN_TEST_MODE"); mode != "" {
		os.Exit(testPlugin(mode))
	}
	dir, err := os.MkdirTemp("", "bcx-plugin-test-")
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err == nil {
		testBin = filepath.Join(dir, "bcd")
		testBinSHA, err = copyFile(testBin, 0o755, nil)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "setup:", err)
		os.Exit(2)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// copyFile copies this test binary to dst with mode, then appends extra;
// it returns the SHA-256 of what it wrote.
func copyFile(dst string, mode os.FileMode, extra []byte) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	src, err := os.Open(self)
	if err != nil {
		return "", err
	}
	defer src.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	w := io.MultiWriter(out, h)
	if _, err := io.Copy(w, src); err != nil {
		out.Close()
		return "", err
	}
	w.Write(extra)
	if err := out.Close(); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), os.Chmod(dst, mode)
}

// testPlugin is the plugin side of the tests.
func testPlugin(mode string) int {
	name := os.Getenv("BCX_PLUGIN_NAME")
	switch mode {
	case "sim":
		// What cgroups the plugin is in as its first act: the shim must
		// have been placed before the plugin's code ran.
		cg, _ := os.ReadFile("/proc/self/cgroup")
		err := Serve(context.Background(), name, probeDriver{driver.NewSim("plugin-host"), string(cg)}, os.Stdin, os.Stdout)
		if err != nil {
			fmt.Fprintln(os.Stderr, "serve:", err)
			return 1
		}
		return 0
	case "marker":
		os.WriteFile(os.Getenv("BCX_MARKER"), []byte("ran"), 0o644)
		return testPlugin("sim")
	case "launcher":
		// Plays bcd: starts a sim plugin, prints its pid, then waits to
		// be killed.
		l := &Launcher{Exe: os.Getenv("BCX_TEST_BIN"), Stderr: os.Stderr}
		p, err := l.Start(context.Background(), Spec{Name: "sim", Path: os.Getenv("BCX_TEST_BIN"), SHA256: os.Getenv("BCX_TEST_SHA"), Env: []string{"BCX_PLUGIN_TEST_MODE=stubborn"}})
		if err != nil {
			fmt.Fprintln(os.Stderr, "start:", err)
			return 1
		}
		fmt.Println(p.Pid())
		io.Copy(io.Discard, os.Stdin)
		return 0
	case "stubborn":
		// Serves, then outlives the end of its input: only a signal
		// ends it.
		testPlugin("sim")
		for {
			unix.Pause()
		}
	case "silent":
		// A child in the plugin's group, then never a handshake.
		exec.Command("/bin/sleep", "1000").Start()
		io.Copy(io.Discard, os.Stdin)
		return 0
	case "bighandshake":
		pad := strings.Repeat("a", MaxHandshake)
		fmt.Fprintf(os.Stdout, `{"protocol":%q,"name":%q,"inventory":{"hostname":%q}}`+"\n", Protocol, name, pad)
		io.Copy(io.Discard, os.Stdin)
		return 0
	case "bigmessage":
		hs, _ := EncodeHandshake(name, driver.NewSim("h").Inventory())
		os.Stdout.Write(hs)
		NewLineReader(os.Stdin).ReadLine(MaxMessage, CodeMessageTooLarge)
		line := `{"id":1,"result":"` + strings.Repeat("a", MaxMessage) + `"}` + "\n"
		os.Stdout.WriteString(line)
		io.Copy(io.Discard, os.Stdin)
		return 0
	}
	return 3
}

// probeDriver is the sim driver plus probe.* kinds that report what the
// plugin's process may do.
type probeDriver struct {
	*driver.Sim
	startCgroups string
}

func errnoOf(err error) int {
	if err == nil {
		return 0
	}
	if e, ok := err.(syscall.Errno); ok {
		return int(e)
	}
	return -1
}

func (p probeDriver) Run(ctx context.Context, kind string, payload []byte) ([]byte, error) {
	switch kind {
	case "probe.whoami":
		status, _ := os.ReadFile("/proc/self/status")
		groups, _ := unix.Getgroups()
		return json.Marshal(map[string]any{"uid": os.Getuid(), "gid": os.Getgid(), "ngroups": len(groups),
			"nnp": statusField(string(status), "NoNewPrivs"), "seccomp": statusField(string(status), "Seccomp"), "pgid": syscall.Getpgrp(), "pid": os.Getpid(), "cgroups_at_start": p.startCgroups})
	case "probe.mount":
		return errnoJSON(unix.Mount("none", "/nonexistent-bcx-probe", "bcx-bogus-fs", 0, ""))
	case "probe.unshare":
		return errnoJSON(unix.Unshare(unix.CLONE_NEWNS))
	case "probe.clone_newuser":
		return errnoJSON(rawClone(unix.CLONE_NEWUSER | uintptr(syscall.SIGCHLD)))
	case "probe.clone3":
		_, _, e := syscall.RawSyscall(unix.SYS_CLONE3, 0, 0, 0)
		return errnoJSON(e)
	case "probe.forkbomb":
		n, err := forkBomb()
		return json.Marshal(map[string]int{"errno": errnoOf(err), "forks": n})
	}
	return p.Sim.Run(ctx, kind, payload)
}

func errnoJSON(err error) ([]byte, error) {
	if e, ok := err.(syscall.Errno); ok && e == 0 {
		err = nil
	}
	return json.Marshal(map[string]int{"errno": errnoOf(err)})
}

func statusField(status, key string) string {
	for _, l := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(l, key+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// rawClone forks with flags; the child exits at once, the parent reaps it.
//
//go:norace
func rawClone(flags uintptr) error {
	pid, _, e := syscall.RawSyscall6(syscall.SYS_CLONE, flags, 0, 0, 0, 0, 0)
	if e != 0 {
		return e
	}
	if pid == 0 {
		syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 0, 0, 0)
	}
	var ws syscall.WaitStatus
	syscall.Wait4(int(pid), &ws, 0, nil)
	return nil
}

// forkBomb forks children that exit at once and stay unreaped (each holds
// a pid) until a fork fails or 100000 succeeded, then reaps them all.
//
//go:norace
func forkBomb() (int, error) {
	var pids []int
	var err error
	for len(pids) < 100000 {
		pid, _, e := syscall.RawSyscall6(syscall.SYS_CLONE, uintptr(syscall.SIGCHLD), 0, 0, 0, 0, 0)
		if e != 0 {
			err = e
			break
		}
		if pid == 0 {
			syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 0, 0, 0)
		}
		pids = append(pids, int(pid))
	}
	for _, pid := range pids {
		var ws syscall.WaitStatus
		syscall.Wait4(pid, &ws, 0, nil)
	}
	return len(pids), err
}

// livingWithEnv returns the pids of processes that are not zombies and
// whose environment holds token.
func livingWithEnv(t *testing.T, token string) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil || !strings.Contains(string(env), token) {
			continue
		}
		stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if i := strings.LastIndexByte(string(stat), ')'); i > 0 && len(stat) > i+2 && stat[i+2] == 'Z' {
			continue
		}
		out = append(out, pid)
	}
	return out
}
