// Package sshdtest starts the real OpenSSH sshd for tests, configured
// with the break-glass files a node writes (sshca.SSHDConfigSnippet), and
// runs the real ssh client and ssh-keygen against it. A missing binary or
// a non-root run skips the test unless BC_REQUIRE_SSH=1, which makes it
// fail (CI). Only for tests.
package sshdtest

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/bettercompute/bettercompute/internal/sshca"
)

// Binary returns path when the OpenSSH binary exists; otherwise it skips
// the test, or fails it under BC_REQUIRE_SSH=1.
func Binary(t testing.TB, path string) string {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		if os.Getenv("BC_REQUIRE_SSH") == "1" {
			t.Fatalf("BC_REQUIRE_SSH=1 but %s is missing: %v", path, err)
		}
		t.Skipf("%s missing (install openssh-client/openssh-server, or set BC_REQUIRE_SSH=1 to fail): %v", path, err)
	}
	return path
}

// Require checks for sshd, ssh, ssh-keygen and root (sshd switches
// users), skipping or, under BC_REQUIRE_SSH=1, failing.
func Require(t testing.TB) {
	t.Helper()
	for _, b := range []string{"/usr/sbin/sshd", "/usr/bin/ssh", "/usr/bin/ssh-keygen"} {
		Binary(t, b)
	}
	if os.Geteuid() != 0 {
		if os.Getenv("BC_REQUIRE_SSH") == "1" {
			t.Fatal("BC_REQUIRE_SSH=1 but the sshd test needs root (sshd switches users)")
		}
		t.Skip("the sshd test needs root (sshd switches users)")
	}
}

// Log collects sshd's output and lets a test wait for a line.
type Log struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{}
}

func newLog() *Log { return &Log{changed: make(chan struct{})} }

// Write appends p.
func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	close(l.changed)
	l.changed = make(chan struct{})
	return len(p), nil
}

// String returns everything logged so far.
func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// Len returns how many bytes have been logged.
func (l *Log) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Len()
}

// WaitFor waits, at most until ctx ends, for sub to appear after offset.
func (l *Log) WaitFor(ctx context.Context, offset int, sub string) bool {
	for {
		l.mu.Lock()
		found := strings.Contains(l.buf.String()[offset:], sub)
		changed := l.changed
		l.mu.Unlock()
		if found {
			return true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		}
	}
}

// StrictModesBase returns a fresh directory in which sshd's StrictModes
// accepts files: it and every parent owned by root (or us) and not group-
// or world-writable (t.TempDir() is usually under /tmp, mode 1777).
func StrictModesBase(t testing.TB) string {
	t.Helper()
	var candidates []string
	candidates = append(candidates, os.TempDir())
	if d, err := os.UserCacheDir(); err == nil {
		candidates = append(candidates, d)
	}
	if d, err := os.UserHomeDir(); err == nil {
		candidates = append(candidates, d)
	}
	if d, err := os.Getwd(); err == nil {
		candidates = append(candidates, d)
	}
	for _, c := range candidates {
		if secureChain(c) {
			dir, err := os.MkdirTemp(c, ".sshd-test-")
			if err != nil {
				continue
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			if err := os.Chmod(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			return dir
		}
	}
	t.Fatalf("no directory among %q passes sshd's StrictModes", candidates)
	return ""
}

func secureChain(dir string) bool {
	dir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return false
	}
	for {
		st, err := os.Stat(dir)
		if err != nil {
			return false
		}
		sys, ok := st.Sys().(*syscall.Stat_t)
		if !ok || (sys.Uid != 0 && int(sys.Uid) != os.Geteuid()) || st.Mode().Perm()&0o022 != 0 {
			return false
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return true
		}
		dir = parent
	}
}

// SSHD is a running sshd.
type SSHD struct {
	Port int
	Log  *Log
	Work string // scratch directory for keys and certificates (0700)
}

// Start writes an sshd_config that uses sshca.SSHDConfigSnippet(filesDir),
// starts sshd -D -e on a free loopback port and waits (bounded) until it
// accepts connections. sshd is killed when the test ends.
func Start(t testing.TB, work, filesDir string) *SSHD {
	t.Helper()
	sshd := Binary(t, "/usr/sbin/sshd")
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		t.Fatalf("sshd needs /run/sshd: %v", err)
	}
	_, hostPriv := NewKey(t)
	hostKey := WritePrivateKey(t, work, "host_ed25519", hostPriv)
	snippet, err := sshca.SSHDConfigSnippet(filesDir)
	if err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	cfg := strings.Join([]string{
		"Port " + strconv.Itoa(port), "ListenAddress 127.0.0.1", "HostKey " + hostKey, "PidFile none", "UsePAM no",
		"StrictModes yes", "PermitRootLogin prohibit-password", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
		"AuthorizedKeysFile none", "LogLevel VERBOSE", snippet,
	}, "\n")
	cfgPath := filepath.Join(work, "sshd_config")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	log := newLog()
	cmd := exec.Command(sshd, "-D", "-e", "-f", cfgPath)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // only the sshd this test started
		<-exited
		if t.Failed() {
			t.Logf("sshd log:\n%s", log.String())
		}
	})
	waitListening(t, port, exited, log)
	return &SSHD{Port: port, Log: log, Work: work}
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// waitListening polls a TCP connect until it succeeds, sshd exits or 15 s
// pass (sshd gives no other signal that it listens).
func waitListening(t testing.TB, port int, exited <-chan error, log *Log) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sshd not listening on %d after 15s: %v\n%s", port, err, log.String())
		}
		select {
		case err := <-exited:
			t.Fatalf("sshd exited before listening: %v\n%s", err, log.String())
		case <-tick.C:
		}
	}
}

// NewKey makes an Ed25519 key pair.
func NewKey(t testing.TB) (ssh.Signer, crypto.Signer) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return s, priv
}

// WritePrivateKey writes priv in OpenSSH's private key format, 0600.
func WritePrivateKey(t testing.TB, dir, name string, priv crypto.Signer) string {
	t.Helper()
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Login runs the system ssh (argv, no shell) as account with the private
// key file and certificate line, and returns its exit code and output.
func (s *SSHD) Login(t testing.TB, account, name string, priv crypto.Signer, certLine []byte) (int, string) {
	t.Helper()
	keyPath := WritePrivateKey(t, s.Work, name, priv)
	certPath := filepath.Join(s.Work, name+"-cert.pub")
	if err := os.WriteFile(certPath, certLine, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, Binary(t, "/usr/bin/ssh"),
		"-F", "none", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
		"-o", "GlobalKnownHostsFile=/dev/null", "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
		"-o", "PreferredAuthentications=publickey", "-o", "ConnectTimeout=10",
		"-i", keyPath, "-o", "CertificateFile="+certPath, "-p", strconv.Itoa(s.Port),
		"--", account+"@127.0.0.1", "true")
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C"}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &exit):
		return exit.ExitCode(), string(out)
	default:
		t.Fatalf("ssh: %v\n%s", err, out)
		return -1, ""
	}
}

// Keygen runs ssh-keygen with args (argv, no shell) in UTC and returns its
// combined output and exit code.
func Keygen(t testing.TB, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(Binary(t, "/usr/bin/ssh-keygen"), args...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "TZ=UTC", "LC_ALL=C"}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("ssh-keygen: %v\n%s", err, out)
	}
	if exit != nil {
		return string(out), exit.ExitCode()
	}
	return string(out), 0
}
