package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/breakglass"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/hosthelper/helperconfig"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
	"github.com/bettercompute/bettercompute/internal/sshca/sshdtest"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// nodeAccount is the unprivileged account the tests run bcd node as,
// made here (useradd) when the machine lacks it, as `bcd install
// --unprivileged` makes bcd.
const nodeAccount = "bcdtest-node"

var (
	bcdOnce sync.Once
	bcdBin  string
	bcdErr  error
)

// builtBcd builds cmd/bcd once per test process into a directory every
// account may read and run (the unprivileged node runs it, and the helper
// compares the caller's executable with its own).
func builtBcd(t *testing.T) string {
	t.Helper()
	bcdOnce.Do(func() {
		dir, err := os.MkdirTemp(rootOnlyParent(t), "bcd-bin-")
		if err != nil {
			bcdErr = err
			return
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			bcdErr = err
			return
		}
		out, err := exec.Command("go", "build", "-o", dir+"/", "github.com/bettercompute/bettercompute/cmd/bcd").CombinedOutput()
		if err != nil {
			bcdErr = fmt.Errorf("build bcd: %w\n%s", err, out)
			return
		}
		bcdBin = filepath.Join(dir, "bcd")
	})
	if bcdErr != nil {
		t.Fatal(bcdErr)
	}
	return bcdBin
}

// rootOnlyParent is a directory whose every parent is root's and closed
// to group and other writes (the helper refuses anything else on the way
// to its socket and files): /run or /var/lib, never /tmp.
func rootOnlyParent(t *testing.T) string {
	t.Helper()
	for _, c := range []string{"/run", "/var/lib"} {
		if fi, err := os.Stat(c); err == nil && fi.IsDir() && fi.Mode().Perm()&0o022 == 0 {
			return c
		}
	}
	t.Fatal("no root-only directory (/run or /var/lib) for the helper's files")
	return ""
}

// requireUnprivilegedSetup skips unless the test can make accounts and
// run runc (root); BC_REQUIRE_ROOT=1 (CI) makes that a failure.
func requireUnprivilegedSetup(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs bcd")
	}
	if os.Geteuid() != 0 || sandboxRuntime(t) != spec.RuntimeRunc {
		if os.Getenv("BC_REQUIRE_ROOT") == "1" {
			t.Fatal("root and runc are required (BC_REQUIRE_ROOT=1)")
		}
		t.Skip("needs root and runc")
	}
}

// ensureAccount returns the unprivileged node account's uid and gid,
// making the account when it is missing.
func ensureAccount(t *testing.T) (uint32, uint32) {
	t.Helper()
	u, err := user.Lookup(nodeAccount)
	if err != nil {
		if out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", nodeAccount).CombinedOutput(); err != nil {
			t.Fatalf("useradd: %v\n%s", err, out)
		}
		if u, err = user.Lookup(nodeAccount); err != nil {
			t.Fatal(err)
		}
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return uint32(uid), uint32(gid)
}

// asAccount runs cmd as uid:gid with no supplementary group.
func asAccount(cmd *exec.Cmd, uid, gid uint32) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}}
}

// procUID is the real uid of a running process, from /proc.
func procUID(t *testing.T, pid int) string {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "Uid:"); ok {
			return strings.Fields(rest)[0]
		}
	}
	t.Fatal("no Uid line")
	return ""
}

// lockedBuffer collects a process's output for the test log.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startProcess starts cmd, stops it (SIGTERM, then waits) at cleanup and
// logs its output when the test failed.
func startProcess(t *testing.T, name string, cmd *exec.Cmd) *lockedBuffer {
	t.Helper()
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s output:\n%s", name, out.String())
		}
	})
	return out
}

// unprivNode is an unprivileged bcd node and its root helper, as
// processes of the built bcd.
type unprivNode struct {
	id, base, socket, state string
	node                    *exec.Cmd
}

// startUnprivileged joins a node as the unprivileged account, starts
// `bcd helper --config` as root (pinned to the environment's command root
// and join key, sandboxes on runc in its own state directory) and `bcd
// node --helper-socket` as the account, and waits until it is connected.
func startUnprivileged(t *testing.T, e *testenv.Env, bin string, uid, gid uint32) unprivNode {
	t.Helper()
	ctx := context.Background()
	base, err := os.MkdirTemp(rootOnlyParent(t), "bcd-unpriv-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	u := unprivNode{base: base, socket: filepath.Join(base, "helper", "helper.sock"), state: filepath.Join(base, "helper-state")}
	nodeDir := filepath.Join(base, "node")
	for _, d := range []string{filepath.Join(base, "helper"), nodeDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := errors2(os.Chmod(base, 0o755), os.Chown(nodeDir, int(uid), int(gid)), os.Chmod(nodeDir, 0o700)); err != nil {
		t.Fatal(err)
	}
	cfg := helperconfig.Default()
	cfg.Socket, cfg.NodeUser, cfg.StateDir, cfg.SSHDDir = u.socket, nodeAccount, u.state, filepath.Join(base, "sshd")
	cfg.CommandRootSHA256 = []string{sha256Hex(e.Bundle.CommandRoot.Raw)}
	cfg.JoinKeyPin = hex.EncodeToString(e.Bundle.JoinKey)
	cfg.Driver, cfg.SandboxRuntime, cfg.ImageStore = "sim", spec.RuntimeRunc, e.ImageStore()
	tok, err := e.CP.Nodes.CreateJoinToken(ctx, audit.Entry{TenantID: iam.RootTenant, Actor: "test"}, pki.RoleNode, "unpriv", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	join := exec.Command(bin, "join", "--data", nodeDir, "--gateway", e.CP.GatewayAddr, "--name", "unpriv")
	join.Env = []string{"BCD_JOIN_TOKEN=" + tok.Token, "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	asAccount(join, uid, gid)
	out, err := join.CombinedOutput()
	m := regexp.MustCompile(`joined as (\S+);`).FindSubmatch(out)
	if err != nil || m == nil {
		t.Fatalf("bcd join as %s: %v\n%s", nodeAccount, err, out)
	}
	u.id = string(m[1])
	cfg.NodeID = u.id // as docs/operations.md says: the id bcd join printed
	cfgPath := filepath.Join(base, "helper.toml")
	if err := os.WriteFile(cfgPath, cfg.Encode(), 0o640); err != nil {
		t.Fatal(err)
	}
	startProcess(t, "bcd helper", exec.Command(bin, "helper", "--config", cfgPath, "--log-level", "debug"))
	pollUntil(t, "the helper's socket", func() bool { _, err := os.Stat(u.socket); return err == nil })
	u.node = exec.Command(bin, "node", "--data", nodeDir, "--driver", "sim", "--helper-socket", u.socket, "--log-level", "debug")
	u.node.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	asAccount(u.node, uid, gid)
	startProcess(t, "bcd node", u.node)
	pollUntil(t, "the unprivileged node connected", func() bool {
		n, err := e.Client.Node(ctx, u.id)
		return err == nil && n.Connected
	})
	return u
}

// errors2 is the first non-nil error.
func errors2(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// sha256Hex is the hex SHA-256 of b.
func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestUnprivilegedNodeRunsSandboxThroughHelper (issue 17's "Done when"):
// bcd node runs as an unprivileged account the test made, bcd helper as
// root, both the built binary; a runc sandbox is created, executed in
// and deleted through the helper (its state lives in the helper's own
// directory, never the node's), and what the helper did reaches the
// control plane's audit log, with the caller's pid, over the node's
// session.
func TestUnprivilegedNodeRunsSandboxThroughHelper(t *testing.T) {
	requireUnprivilegedSetup(t)
	bin := builtBcd(t)
	uid, gid := ensureAccount(t)
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		e := testenv.Start(t, db, testenv.Options{SandboxRuntime: spec.RuntimeRunc})
		_, admin := e.TenantAdmin(t, "acme")
		ctx := context.Background()
		importSmallTemplate(t, e, admin, spec.RuntimeRunc, 0)
		u := startUnprivileged(t, e, bin, uid, gid)
		if got := procUID(t, u.node.Process.Pid); got != strconv.Itoa(int(uid)) {
			t.Fatalf("bcd node runs as uid %s, want the unprivileged %d", got, uid)
		}
		x, err := admin.CreateSandbox(ctx, "", "small")
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		if x.NodeID != u.id || x.Runtime != spec.RuntimeRunc {
			t.Fatalf("created %+v, want on the unprivileged node %s with runc", x, u.id)
		}
		if _, err := os.Stat(filepath.Join(u.state, "sandbox", "state", x.ID+".json")); err != nil {
			t.Fatalf("the helper does not hold the sandbox in its own state: %v", err)
		}
		r, err := admin.Exec(ctx, x.ID, []string{"echo", "hello"}, 10)
		if err != nil || r.ExitCode != 0 || !r.Attested || string(r.Stdout) != "hello\n" {
			t.Fatalf("exec through the helper: %+v %v", r, err)
		}
		if freed, err := admin.DeleteSandbox(ctx, x.ID); err != nil || !freed {
			t.Fatalf("delete: freed %v, %v", freed, err)
		}
		if _, err := os.Stat(filepath.Join(u.state, "sandbox", "state", x.ID+".json")); !os.IsNotExist(err) {
			t.Fatalf("the helper still holds the deleted sandbox: %v", err)
		}
		// Break-glass SSH on an unprivileged node: the ssh.access state is
		// written by the helper, by kind and id, in its own sshd folder.
		key, _ := sshdtest.NewKey(t)
		var issued breakglass.Issued
		if err := e.Client.Call(ctx, "nodes.issueSshCert", breakglass.IssueIn{NodeID: u.id, Account: "ops",
			PublicKey: string(ssh.MarshalAuthorizedKey(key.PublicKey()))}, &issued); err != nil {
			t.Fatal(err)
		}
		if c := e.WaitCommand(t, issued.CommandID); c.State != wire.StateSucceeded {
			t.Fatalf("ssh.access on the unprivileged node: %s %q", c.State, c.Reason)
		}
		principals := filepath.Join(u.base, "sshd", "principals", "ops")
		b, err := os.ReadFile(principals)
		fi, serr := os.Stat(principals)
		if err != nil || serr != nil || string(b) != "ops@"+u.id+"\n" || fi.Sys().(*syscall.Stat_t).Uid != 0 {
			t.Fatalf("the helper's principals file: %q %v %v", b, err, serr)
		}
		for _, op := range []string{"sandbox.create", "sandbox.exec", "sandbox.delete", "ssh.access"} {
			pollUntil(t, "the helper's "+op+" audited", func() bool {
				var n int
				_ = db.QueryRowContext(ctx, `SELECT COUNT(*) FROM audit_events WHERE actor = $1 AND action = $2 AND outcome = 'allowed' AND details LIKE $3`,
					"node/"+u.id, "compute:nodes:helper."+op, fmt.Sprintf(`%%"pid":%d%%`, u.node.Process.Pid)).Scan(&n)
				return n >= 1
			})
		}
	})
}

// TestMain removes the bcd built for the tests (builtBcd) when they end.
// With BC_BENCH_CLIENT=1 the binary is the sandbox benchmark's client
// instead (benchclient_test.go).
func TestMain(m *testing.M) {
	if os.Getenv(benchClientEnv) == "1" {
		os.Exit(runBenchClient(os.Stdin, os.Stdout))
	}
	code := m.Run()
	if bcdBin != "" {
		_ = os.RemoveAll(filepath.Dir(bcdBin))
	}
	os.Exit(code)
}
