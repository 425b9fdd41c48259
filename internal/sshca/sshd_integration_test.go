package sshca

import (
	"bytes"
	"context"
	"crypto"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// logBuffer collects sshd's stderr and lets a test wait for a line.
type logBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{} // closed and replaced on every write
}

func newLogBuffer() *logBuffer { return &logBuffer{changed: make(chan struct{})} }

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	close(l.changed)
	l.changed = make(chan struct{})
	return len(p), nil
}

// String returns everything logged so far.
func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// waitFor waits, at most until ctx ends, for sub to appear after offset.
func (l *logBuffer) waitFor(ctx context.Context, offset int, sub string) bool {
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

// len returns how many bytes have been logged.
func (l *logBuffer) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Len()
}

// strictModesBase returns a directory in which sshd's StrictModes accepts
// files: it and every parent up to / owned by root (or us) and not group-
// or world-writable. t.TempDir() is usually under /tmp (mode 1777), which
// sshd refuses for AuthorizedPrincipalsFile, so other bases are tried.
func strictModesBase(t *testing.T) string {
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
			dir, err := os.MkdirTemp(c, ".sshca-test-")
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

// secureChain reports whether dir and all its parents are owned by root or
// us and not group- or world-writable.
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

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// sshdUnderTest is a running sshd and what a test needs to talk to it.
type sshdUnderTest struct {
	port int
	log  *logBuffer
	dir  string // scratch directory for keys and certificates
}

// startSSHD writes an sshd_config that uses SSHDConfigSnippet(filesDir),
// starts sshd -D -e on a free loopback port and waits (bounded) until it
// accepts TCP connections. sshd is stopped when the test ends.
func startSSHD(t *testing.T, work, filesDir string) *sshdUnderTest {
	t.Helper()
	sshd := openssh(t, "/usr/sbin/sshd")
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil { // sshd's privilege separation dir (Debian's init makes it)
		t.Fatalf("sshd needs /run/sshd: %v", err)
	}
	_, hostPriv := newSigner(t)
	hostKey := writePrivateKey(t, work, "host_ed25519", hostPriv)
	snippet, err := SSHDConfigSnippet(filesDir)
	if err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	cfg := strings.Join([]string{
		"Port " + strconv.Itoa(port),
		"ListenAddress 127.0.0.1",
		"HostKey " + hostKey,
		"PidFile none",
		"UsePAM no",
		"StrictModes yes",
		"PermitRootLogin prohibit-password",
		"PasswordAuthentication no",
		"KbdInteractiveAuthentication no",
		"AuthorizedKeysFile none",
		"LogLevel VERBOSE",
		snippet,
	}, "\n")
	cfgPath := writeFile(t, work, "sshd_config", []byte(cfg), 0o600)

	log := newLogBuffer()
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
	return &sshdUnderTest{port: port, log: log, dir: work}
}

// waitListening polls a TCP connect to port until it succeeds, sshd exits
// or 15 s pass.
func waitListening(t *testing.T, port int, exited <-chan error, log *logBuffer) {
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

// login runs the system ssh (argv, no shell) with key and cert as account
// and returns its exit code and output.
func (s *sshdUnderTest) login(t *testing.T, account string, priv crypto.Signer, cert *ssh.Certificate, name string) (int, string) {
	t.Helper()
	name = strings.ReplaceAll(name, " ", "-") // a file name ssh's -o takes as one token
	keyPath := writePrivateKey(t, s.dir, name, priv)
	certPath := writeFile(t, s.dir, name+"-cert.pub", ssh.MarshalAuthorizedKey(cert), 0o644)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, openssh(t, "/usr/bin/ssh"),
		"-F", "none",
		"-o", "BatchMode=yes",
		"-o", "StrictHostKeyChecking=no",
		"-o", "UserKnownHostsFile=/dev/null",
		"-o", "GlobalKnownHostsFile=/dev/null",
		"-o", "IdentitiesOnly=yes",
		"-o", "IdentityAgent=none",
		"-o", "PreferredAuthentications=publickey",
		"-o", "ConnectTimeout=10",
		"-i", keyPath,
		"-o", "CertificateFile="+certPath,
		"-p", strconv.Itoa(s.port),
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

// TestSSHDEnforcesBreakGlassCertificates starts the real sshd with the
// files WriteSSHDFiles wrote for node n1 and the current account, and the
// real ssh client logs in with issued certificates: a valid one logs in
// (so the KRL, which revokes another serial, loads); sshd itself refuses a
// revoked serial, an expired certificate, a certificate for another node's
// principal, one for the right principal from another CA, and, after the
// KRL is rewritten, the serial that had logged in.
func TestSSHDEnforcesBreakGlassCertificates(t *testing.T) {
	openssh(t, "/usr/sbin/sshd")
	openssh(t, "/usr/bin/ssh")
	if os.Geteuid() != 0 {
		if os.Getenv("BC_REQUIRE_SSH") == "1" {
			t.Fatal("BC_REQUIRE_SSH=1 but the sshd test needs root (sshd switches users)")
		}
		t.Skip("the sshd test needs root (sshd switches users)")
	}
	me, err := user.Current()
	if err != nil || !ValidAccount(me.Username) {
		t.Fatalf("current account %v is not a valid account (%v)", me, err)
	}
	account := me.Username

	base := strictModesBase(t)
	filesDir := filepath.Join(base, "sshd-files")
	work := filepath.Join(base, "work")
	if err := os.Mkdir(work, 0o700); err != nil {
		t.Fatal(err)
	}
	ca, _ := newSigner(t)
	otherCA, _ := newSigner(t)
	const revokedSerial = 200
	files := Files{CA: ca.PublicKey(), NodeID: "n1", Accounts: []string{account}, KRL: KRL{Version: 1, Serials: []uint64{revokedSerial}, Generated: time.Now()}}
	if err := WriteSSHDFiles(filesDir, files); err != nil {
		t.Fatal(err)
	}
	s := startSSHD(t, work, filesDir)

	now := time.Now()
	issue := func(signer ssh.Signer, serial uint64, node string, at time.Time) (crypto.Signer, *ssh.Certificate) {
		user, priv := newSigner(t)
		cert, err := Issue(signer, Request{
			PublicKey: authorizedLine(user.PublicKey()), Account: account, NodeID: node,
			Serial: serial, NotAfter: at.Add(24 * time.Hour),
		}, at)
		if err != nil {
			t.Fatal(err)
		}
		return priv, cert
	}
	// refused runs a login that must fail, and waits for sshd's own
	// verdict: its reason (when sshd logs one at VERBOSE) and the failed
	// publickey line naming this certificate's serial and CA, so that a
	// client-side error never passes for a refusal.
	refused := func(name string, priv crypto.Signer, cert *ssh.Certificate, reason string) {
		t.Helper()
		offset := s.log.len()
		code, out := s.login(t, account, priv, cert, name)
		if code == 0 {
			t.Errorf("%s: logged in, want refused\n%s", name, out)
			return
		}
		failed := fmt.Sprintf("Failed publickey for %s from 127.0.0.1", account)
		verdict := fmt.Sprintf("(serial %d) CA ED25519 %s", cert.Serial, ssh.FingerprintSHA256(cert.SignatureKey))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, want := range []string{reason, failed, verdict} {
			if !s.log.waitFor(ctx, offset, want) {
				t.Errorf("%s: refused (exit %d) but sshd did not log %q:\n%s\nssh said:\n%s", name, code, want, s.log.String()[offset:], out)
				return
			}
		}
	}

	validPriv, valid := issue(ca, 100, "n1", now)
	if code, out := s.login(t, account, validPriv, valid, "valid"); code != 0 {
		t.Fatalf("valid certificate: exit %d, want 0\n%s", code, out)
	}
	priv, cert := issue(ca, revokedSerial, "n1", now)
	refused("revoked", priv, cert, "revoked by file "+filepath.Join(filesDir, KRLFile))
	priv, cert = issue(ca, 101, "n1", now.Add(-2*time.Hour))
	refused("expired", priv, cert, "Certificate invalid: expired")
	priv, cert = issue(ca, 102, "n2", now)
	refused("other node", priv, cert, "Certificate does not contain an authorized principal")
	priv, cert = issue(otherCA, 103, "n1", now)
	refused("other CA", priv, cert, "") // sshd names no reason at VERBOSE; the verdict line names the CA

	files.KRL = KRL{Version: 2, Serials: []uint64{revokedSerial, 100}, Generated: time.Now()}
	if err := WriteSSHDFiles(filesDir, files); err != nil {
		t.Fatal(err)
	}
	refused("revoked after login", validPriv, valid, "revoked by file "+filepath.Join(filesDir, KRLFile))
}
