package hosthelper

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"

	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
)

// The node account the tests configure; no account needs to exist, the
// callers get these ids through SysProcAttr.Credential.
const (
	nodeUID  = 65533
	nodeGID  = 65533
	otherUID = 65534
	otherGID = 65534
)

const (
	envSocket  = "HOSTHELPER_TEST_CLIENT_SOCKET"
	envRequest = "HOSTHELPER_TEST_CLIENT_REQUEST"
)

// TestMain lets the test binary act as a helper client when re-executed
// under another uid by the tests.
func TestMain(m *testing.M) {
	if sock := os.Getenv(envSocket); sock != "" {
		os.Exit(actAsClient(sock, os.Getenv(envRequest)))
	}
	os.Exit(m.Run())
}

// outcome is what a re-executed client prints.
type outcome struct {
	Code   string          `json:"code"`
	Result json.RawMessage `json:"result"`
	Err    string          `json:"err"`
}

func actAsClient(sock, reqJSON string) int {
	var req helperwire.Request
	if err := json.Unmarshal([]byte(reqJSON), &req); err != nil {
		return 3
	}
	res, err := (&helperwire.Client{Socket: sock}).Call(context.Background(), &req)
	var out outcome
	var ref *helperwire.Refusal
	switch {
	case errors.As(err, &ref):
		out.Code = ref.Code
	case err != nil:
		out.Err = err.Error()
	default:
		out.Result = res
	}
	b, _ := json.Marshal(out)
	os.Stdout.Write(b)
	return 0
}

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type fixture struct {
	base string // root-owned 0755, reachable by the unprivileged callers
	sock string
	exe  string // the test binary, hard-linked where the callers can run it
	srv  *Server
	log  *syncBuffer
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the helper's tests bind root's socket and run callers as other uids: run as root")
	}
}

// openBase makes a root-owned 0755 directory every uid can reach (t.TempDir
// is 0700, which the unprivileged callers could not enter).
func openBase(t *testing.T) string {
	t.Helper()
	needRoot(t)
	base, err := os.MkdirTemp("/tmp", "hosthelper-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	return base
}

// newFixture serves a helper configured by mut on a socket under a fresh
// open base; the server stops at the test's end.
func newFixture(t *testing.T, mut func(*Config), register func(*Server)) *fixture {
	t.Helper()
	f := &fixture{base: openBase(t), log: &syncBuffer{}}
	f.sock = filepath.Join(f.base, "helper.sock")
	f.exe = linkExe(t, f.base)
	cfg := Config{NodeUID: nodeUID, NodeGID: nodeGID, Log: slog.New(slog.NewJSONHandler(f.log, nil))}
	if mut != nil {
		mut(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if register != nil {
		register(srv)
	}
	f.srv = srv
	l, err := Listen(f.sock, 0, nodeGID)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return f
}

// linkExe hard-links the test binary into base/bin (same inode as the
// running helper), copying when a link is impossible.
func linkExe(t *testing.T, base string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "bin")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "bcd.test")
	if os.Link(self, dst) != nil {
		copyFile(t, self, dst)
	}
	return dst
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// runAs re-executes exe as a helper client under the given credentials and
// returns what it got and its pid.
func runAs(t *testing.T, f *fixture, exe string, cred *syscall.Credential, req helperwire.Request) (outcome, int) {
	t.Helper()
	rj, _ := json.Marshal(req)
	cmd := exec.Command(exe)
	cmd.Dir = f.base
	cmd.Env = []string{envSocket + "=" + f.sock, envRequest + "=" + string(rj)}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("client as uid %d: %v: %s", cred.Uid, err, stderr.String())
	}
	var o outcome
	if err := json.Unmarshal(out, &o); err != nil {
		t.Fatalf("client output %q: %v", out, err)
	}
	return o, cmd.Process.Pid
}

const pythonClient = `
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(sys.argv[2].encode())
s.shutdown(socket.SHUT_WR)
out = b""
while True:
    b = s.recv(65536)
    if not b:
        break
    out += b
sys.stdout.write(out.decode())
`

// runPython connects with a Python client as the node account and returns
// the helper's raw response.
func runPython(t *testing.T, f *fixture, req string) helperwire.Response {
	t.Helper()
	cmd := exec.Command(pythonPath(t), "-c", pythonClient, f.sock, req)
	cmd.Dir = f.base
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nodeUID, Gid: nodeGID}}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python client: %v: %s", err, stderr.String())
	}
	resp, err := helperwire.DecodeResponse(out)
	if err != nil {
		t.Fatalf("python client got %q: %v", out, err)
	}
	return *resp
}

// rawCall sends b as root from this process (the helper's own executable,
// so the caller checks pass) and returns the decoded response.
func rawCall(t *testing.T, sock string, b []byte) helperwire.Response {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	uc := c.(*net.UnixConn)
	if _, err := uc.Write(b); err == nil {
		_ = uc.CloseWrite()
	}
	out, err := io.ReadAll(uc)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := helperwire.DecodeResponse(out)
	if err != nil {
		t.Fatalf("response %q: %v", out, err)
	}
	return *resp
}

func call(t *testing.T, sock string, req helperwire.Request) (json.RawMessage, string) {
	t.Helper()
	res, err := (&helperwire.Client{Socket: sock}).Call(context.Background(), &req)
	var ref *helperwire.Refusal
	if errors.As(err, &ref) {
		return nil, ref.Code
	}
	if err != nil {
		t.Fatal(err)
	}
	return res, ""
}

// pythonPath is a python3 every uid can run: the system's, not one under
// root's home (pyenv).
func pythonPath(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/python3", "/usr/local/bin/python3"} {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			return real
		}
	}
	t.Skip("no system python3")
	return ""
}

func fileSHA(t *testing.T, path string) [sha256.Size]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

func itoa(n int) string { return strconv.Itoa(n) }
