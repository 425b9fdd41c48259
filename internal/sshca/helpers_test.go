package sshca

import (
	"bytes"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/bettercompute/bettercompute/internal/errs"
)

// testNow is a fixed signing time for tests that do not talk to sshd.
var testNow = time.Date(2030, 5, 6, 7, 8, 9, 500_000_000, time.UTC)

// newSigner makes a fresh Ed25519 key as an ssh.Signer and its private key.
func newSigner(t *testing.T) (ssh.Signer, crypto.Signer) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromSigner(priv)
	if err != nil {
		t.Fatal(err)
	}
	return s, priv
}

// authorizedLine returns key as one authorized_keys line with a newline.
func authorizedLine(key ssh.PublicKey) []byte { return ssh.MarshalAuthorizedKey(key) }

// request is a good request for key, for account alice on node n1.
func request(key ssh.PublicKey, serial uint64) Request {
	return Request{
		PublicKey: authorizedLine(key),
		Account:   "alice",
		NodeID:    "n1",
		Serial:    serial,
		NotAfter:  testNow.Add(24 * time.Hour),
	}
}

// wantRefusal fails unless err is a coded error with code and exactly msg.
func wantRefusal(t *testing.T, err error, code errs.Code, msg string) {
	t.Helper()
	var e *errs.Error
	if !errors.As(err, &e) {
		t.Fatalf("err = %v, want %s %q", err, code, msg)
	}
	if e.Code != code || e.Message != msg {
		t.Fatalf("refusal = %s %q, want %s %q", e.Code, e.Message, code, msg)
	}
}

// writeFile writes data to dir/name with mode and returns the path.
func writeFile(t *testing.T, dir, name string, data []byte, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// openssh returns the path of an OpenSSH binary, skipping the test when it
// is missing unless BC_REQUIRE_SSH=1, which makes it a failure (CI).
func openssh(t *testing.T, path string) string {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		if os.Getenv("BC_REQUIRE_SSH") == "1" {
			t.Fatalf("BC_REQUIRE_SSH=1 but %s is missing: %v", path, err)
		}
		t.Skipf("%s missing (install openssh-client/openssh-server, or set BC_REQUIRE_SSH=1 to fail): %v", path, err)
	}
	return path
}

// sshKeygen runs ssh-keygen with args (argv, no shell) in UTC and returns
// its combined output and exit code.
func sshKeygen(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(openssh(t, "/usr/bin/ssh-keygen"), args...)
	cmd.Env = []string{"TZ=UTC", "LC_ALL=C"}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return out.String(), 0
	case errors.As(err, &exit):
		return out.String(), exit.ExitCode()
	default:
		t.Fatalf("ssh-keygen %v: %v", args, err)
		return "", -1
	}
}
