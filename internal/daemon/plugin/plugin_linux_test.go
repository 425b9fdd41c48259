package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/kinds"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("confinement tests need root")
	}
}

// testCgroups returns a cgroup config under a parent of this test's own,
// removed at the end.
func testCgroups(t *testing.T, pidsMax int64) *CgroupConfig {
	t.Helper()
	parent := fmt.Sprintf("bcx-plugin-test-%d-%s", os.Getpid(), t.Name())
	t.Cleanup(func() {
		for _, h := range []string{"pids", "memory", ""} {
			os.Remove(filepath.Join("/sys/fs/cgroup", h, parent))
		}
	})
	return &CgroupConfig{Root: "/sys/fs/cgroup", Parent: parent, MemoryMax: 1 << 30, PidsMax: pidsMax}
}

func launcher(t *testing.T, root bool, cg *CgroupConfig, names ...string) *Launcher {
	t.Helper()
	ids, err := AssignIDs(names, AccountTaken)
	if err != nil {
		t.Fatal(err)
	}
	return &Launcher{Exe: testBin, Root: root, IDs: ids, Cgroup: cg, Stderr: os.Stderr}
}

func spec(name, mode string, env ...string) Spec {
	return Spec{Name: name, Path: testBin, SHA256: testBinSHA, Env: append([]string{"BCX_PLUGIN_TEST_MODE=" + mode}, env...)}
}

func run(t *testing.T, p *Plugin, kind string) map[string]any {
	t.Helper()
	b, err := p.Run(context.Background(), kind, nil)
	if err != nil {
		t.Fatalf("%s: %v", kind, err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", kind, err)
	}
	return m
}

func assertGone(t *testing.T, cg *Cgroups) {
	t.Helper()
	for _, d := range cg.Dirs() {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("cgroup %s still there: %v", d, err)
		}
	}
}

// TestSimPluginConfined: the sim driver runs as a plugin, in its cgroups
// from its first instruction (the gate), under its own uid
// and gid from the block, no supplementary groups, no_new_privs, seccomp
// filter mode, its own process group and cgroups, and node.ping makes the
// round trip through the driver.Driver adapter; Close removes the cgroups.
func TestSimPluginConfined(t *testing.T) {
	needRoot(t)
	l := launcher(t, true, testCgroups(t, 64), "sim")
	// bcd's own supplementary groups must not reach the plugin.
	if err := syscall.Setgroups([]int{4242}); err != nil {
		t.Fatal(err)
	}
	defer syscall.Setgroups(nil)
	p, err := l.Start(context.Background(), spec("sim", "sim"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	var d driver.Driver = p
	if d.Name() != "sim" || d.Inventory().GetHostname() != "plugin-host" || len(d.Inventory().GetGpus()) != 8 {
		t.Fatalf("handshake: %s %v", d.Name(), d.Inventory())
	}
	if pong := run(t, p, kinds.NodePing); pong["pong"] != true || pong["hostname"] != "plugin-host" {
		t.Fatalf("node.ping: %v", pong)
	}
	who := run(t, p, "probe.whoami")
	id := float64(l.IDs["sim"])
	if who["uid"] != id || who["gid"] != id || who["ngroups"] != float64(0) {
		t.Fatalf("identity: %v, want uid=gid=%v and no groups", who, id)
	}
	if who["nnp"] != "1" || who["seccomp"] != "2" || who["pgid"] != who["pid"] || who["pid"] != float64(p.Pid()) {
		t.Fatalf("confinement: %v", who)
	}
	if at := who["cgroups_at_start"].(string); !strings.Contains(at, ":pids:/"+l.Cgroup.Parent+"/sim\n") || !strings.Contains(at, ":memory:/"+l.Cgroup.Parent+"/sim\n") {
		t.Fatalf("plugin code ran outside its cgroups: %q", at)
	}
	procs, err := p.Cgroups().Procs()
	if err != nil || !slices.Contains(procs, p.Pid()) {
		t.Fatalf("plugin %d not in its cgroup: %v %v", p.Pid(), procs, err)
	}
	if _, err := p.Run(context.Background(), "no.such.kind", nil); err == nil || err.Error() != driver.ErrUnsupported.Error() {
		t.Fatalf("unknown kind: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	assertGone(t, p.Cgroups())
	if _, err := p.Run(context.Background(), kinds.NodePing, nil); CodeOf(err) != CodeClosed {
		t.Fatalf("run after close: %v", err)
	}
}

// TestFilterRefusesMountAndUnshare runs the probe as root (no identity
// switch), so only the seccomp filter stands between it and the calls:
// mount, unshare(CLONE_NEWNS) and clone(CLONE_NEWUSER) answer EPERM, clone3
// ENOSYS, while the plugin's own runtime (clone without CLONE_NEW*) runs.
func TestFilterRefusesMountAndUnshare(t *testing.T) {
	needRoot(t)
	l := launcher(t, false, nil)
	p, err := l.Start(context.Background(), spec("probe", "sim"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	for kind, want := range map[string]syscall.Errno{
		"probe.mount": syscall.EPERM, "probe.unshare": syscall.EPERM,
		"probe.clone_newuser": syscall.EPERM, "probe.clone3": syscall.ENOSYS,
	} {
		if got := run(t, p, kind)["errno"]; got != float64(want) {
			t.Errorf("%s: errno %v, want %d (%v)", kind, got, want, want)
		}
	}
	if who := run(t, p, "probe.whoami"); who["uid"] != float64(0) || who["seccomp"] != "2" {
		t.Fatalf("probe ran as %v", who)
	}
}

// TestPidsLimitStopsForkBomb: with pids.max 32 a plugin forking without
// end gets EAGAIN (after fewer than 32 forks), and the host can still
// start a process.
func TestPidsLimitStopsForkBomb(t *testing.T) {
	needRoot(t)
	l := launcher(t, true, testCgroups(t, 32), "bomb")
	p, err := l.Start(context.Background(), spec("bomb", "sim"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	res := run(t, p, "probe.forkbomb")
	if res["errno"] != float64(syscall.EAGAIN) || res["forks"].(float64) >= 32 {
		t.Fatalf("fork bomb: %v, want EAGAIN before 32 forks", res)
	}
	if err := exec.Command("/bin/true").Run(); err != nil {
		t.Fatalf("host cannot start a process: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	assertGone(t, p.Cgroups())
}

// TestSwappedBinaryRefused: a binary whose bytes no longer match its pin
// is refused with plugin-hash-mismatch and never runs (it would have
// written a marker); a symlink, and a file others may write, are refused
// before hashing.
func TestSwappedBinaryRefused(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	os.Chmod(dir, 0o777)
	marker := filepath.Join(dir, "ran")
	path := filepath.Join(dir, "plugin")
	pin, err := copyFile(path, 0o755, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := copyFile(path, 0o755, []byte("swapped")); err != nil { // still runs, other bytes
		t.Fatal(err)
	}
	l := launcher(t, true, nil, "swap")
	s := Spec{Name: "swap", Path: path, SHA256: pin, Env: []string{"BCX_PLUGIN_TEST_MODE=marker", "BCX_MARKER=" + marker}}
	if _, err := l.Start(context.Background(), s); CodeOf(err) != CodeHashMismatch {
		t.Fatalf("swapped binary: %v, want %s", err, CodeHashMismatch)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("the swapped binary ran: %v", err)
	}
	link := filepath.Join(dir, "link")
	os.Symlink(testBin, link)
	s.Path, s.SHA256 = link, testBinSHA
	if _, err := l.Start(context.Background(), s); CodeOf(err) != CodeOpen {
		t.Fatalf("symlink: %v, want %s", err, CodeOpen)
	}
	s.Path, s.SHA256 = path, pin
	copyFile(path, 0o775, nil)
	if _, err := l.Start(context.Background(), s); CodeOf(err) != CodeWritable {
		t.Fatalf("group-writable: %v, want %s", err, CodeWritable)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("a refused binary ran: %v", err)
	}
}

// TestUserRootRefused: [plugins] user = "root" is refused before anything
// is opened.
func TestUserRootRefused(t *testing.T) {
	l := &Launcher{Exe: testBin, Root: true, User: "root"}
	if _, err := l.Start(context.Background(), spec("sim", "sim")); CodeOf(err) != CodeUserRoot {
		t.Fatalf("user root: %v, want %s", err, CodeUserRoot)
	}
}

// TestHandshakeTooLarge: a handshake line over 64 KiB is refused with
// plugin-handshake-too-large, and the plugin is killed with its cgroup.
func TestHandshakeTooLarge(t *testing.T) {
	needRoot(t)
	cg := testCgroups(t, 64)
	l := launcher(t, true, cg, "big")
	token := fmt.Sprintf("BCX_TEST_TOKEN=%s-%d", t.Name(), os.Getpid())
	if _, err := l.Start(context.Background(), spec("big", "bighandshake", token)); CodeOf(err) != CodeHandshakeTooLarge {
		t.Fatalf("big handshake: %v, want %s", err, CodeHandshakeTooLarge)
	}
	if left := livingWithEnv(t, token); len(left) != 0 {
		t.Fatalf("plugin processes left: %v", left)
	}
	assertGone(t, &Cgroups{dirs: []string{filepath.Join(cg.Root, "pids", cg.Parent, "big")}})
}

// TestMessageTooLarge: a response line over 16 MiB fails the Run with
// plugin-message-too-large and kills the plugin: its cgroup is empty when
// Run returns, and later Runs fail with the same code.
func TestMessageTooLarge(t *testing.T) {
	needRoot(t)
	l := launcher(t, true, testCgroups(t, 64), "big")
	p, err := l.Start(context.Background(), spec("big", "bigmessage"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if _, err := p.Run(context.Background(), kinds.NodePing, nil); CodeOf(err) != CodeMessageTooLarge {
		t.Fatalf("big message: %v, want %s", err, CodeMessageTooLarge)
	}
	if procs, err := p.Cgroups().Procs(); err != nil || len(procs) != 0 {
		t.Fatalf("plugin not killed: %v %v", procs, err)
	}
	if _, err := p.Run(context.Background(), kinds.NodePing, nil); CodeOf(err) != CodeMessageTooLarge {
		t.Fatalf("after the refusal: %v", err)
	}
}

// TestHandshakeDeadlineKills: a plugin that never handshakes (and started
// a child in its group) is refused with plugin-handshake-timeout at the
// deadline, and no process of it is left.
func TestHandshakeDeadlineKills(t *testing.T) {
	needRoot(t)
	l := launcher(t, true, testCgroups(t, 64), "mute")
	l.HandshakeTimeout = 300 * time.Millisecond
	token := fmt.Sprintf("BCX_TEST_TOKEN=%s-%d", t.Name(), os.Getpid())
	if _, err := l.Start(context.Background(), spec("mute", "silent", token)); CodeOf(err) != CodeHandshakeTimeout {
		t.Fatalf("silent plugin: %v, want %s", err, CodeHandshakeTimeout)
	}
	if left := livingWithEnv(t, token); len(left) != 0 {
		for _, pid := range left { // so a failure leaves nothing running on the machine
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		t.Fatalf("plugin processes left: %v", left)
	}
}

// TestPluginDiesWithBcd: when the process that started a plugin dies
// (SIGKILL, no Close), the kernel kills the plugin (Pdeathsig on the
// shim, kept across its exec). The test waits on a pidfd, not a clock; if
// the plugin outlived bcd the wait never ends and the test times out.
func TestPluginDiesWithBcd(t *testing.T) {
	needRoot(t)
	bcd := exec.Command(testBin)
	bcd.Env = []string{"BCX_PLUGIN_TEST_MODE=launcher", "BCX_TEST_BIN=" + testBin, "BCX_TEST_SHA=" + testBinSHA}
	bcd.Stderr = os.Stderr
	in, _ := bcd.StdinPipe()
	defer in.Close()
	out, _ := bcd.StdoutPipe()
	if err := bcd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := NewLineReader(out).ReadLine(64, CodeMessageTooLarge)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(string(line))
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatalf("plugin %d: %v", pid, err)
	}
	defer unix.Close(pidfd)
	bcd.Process.Kill()
	bcd.Wait()
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for {
		if _, err := unix.Poll(fds, -1); err != unix.EINTR {
			break
		}
	}
	// The pidfd turns readable only when the process has exited (a
	// zombie at most, until whoever inherited it reaps it).
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if i := strings.LastIndexByte(string(stat), ')'); err == nil && (i < 0 || len(stat) < i+3 || stat[i+2] != 'Z') {
		t.Fatalf("plugin %d still alive after bcd died: %s", pid, stat)
	}
}

// TestPluginOutlivesTheThreadThatStartedIt: a plugin dies with bcd
// (Pdeathsig), which Linux ties to the thread that forked it; a plugin
// started from a goroutine locked to a thread that then ends (as the
// sandbox host's namespace work does) keeps running, because the launcher
// forks from a thread of its own.
func TestPluginOutlivesTheThreadThatStartedIt(t *testing.T) {
	l := launcher(t, false, nil, "sim")
	type started struct {
		p   *Plugin
		tid int
		err error
	}
	// This goroutine keeps its thread while it waits, so the one below
	// runs on another (this one is often the main thread).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var s started
	for try := 0; ; try++ {
		got := make(chan started, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
			if unix.Gettid() == unix.Getpid() {
				// The main thread is never ended (the runtime parks it
				// instead): try on another.
				runtime.UnlockOSThread()
				got <- started{tid: -1}
				return
			}
			p, err := l.Start(context.Background(), spec("sim", "sim"))
			got <- started{p, unix.Gettid(), err}
		}()
		if s = <-got; s.tid != -1 {
			break
		}
		if try == 100 {
			t.Fatal("no goroutine ran off the main thread")
		}
	}
	if s.err != nil {
		t.Fatal(s.err)
	}
	t.Cleanup(func() { s.p.Close() })
	task := fmt.Sprintf("/proc/self/task/%d", s.tid)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(task); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("thread %d did not end", s.tid)
		}
		runtime.Gosched()
	}
	if pong := run(t, s.p, kinds.NodePing); pong["pong"] != true {
		t.Fatalf("node.ping after the starting thread ended: %v", pong)
	}
}
