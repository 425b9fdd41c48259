package sshca

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/ids"
)

// readKey reads a committed public key line from testdata/keys.
func readKey(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "keys", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestIssueSignsTheNarrowCertificate: one principal <account>@<node>,
// permit-pty only, no critical options, the given serial, valid from
// now-Backdate for exactly MaxValidity, signed by the CA so that a
// CertChecker trusting the CA accepts it for that principal alone.
func TestIssueSignsTheNarrowCertificate(t *testing.T) {
	ca, _ := newSigner(t)
	user, _ := newSigner(t)
	cert, err := Issue(ca, request(user.PublicKey(), 42), testNow)
	if err != nil {
		t.Fatal(err)
	}
	if cert.CertType != ssh.UserCert {
		t.Errorf("cert type = %d, want user", cert.CertType)
	}
	if !slices.Equal(cert.ValidPrincipals, []string{"alice@n1"}) {
		t.Errorf("principals = %q, want [alice@n1]", cert.ValidPrincipals)
	}
	if len(cert.Extensions) != 1 || cert.Extensions["permit-pty"] != "" {
		t.Errorf("extensions = %v, want only permit-pty", cert.Extensions)
	}
	if len(cert.CriticalOptions) != 0 {
		t.Errorf("critical options = %v, want none", cert.CriticalOptions)
	}
	if cert.Serial != 42 || cert.KeyId != "bc-break-glass serial=42 account=alice node=n1" {
		t.Errorf("serial %d key id %q", cert.Serial, cert.KeyId)
	}
	wantAfter := uint64(testNow.Unix() - 30)
	if cert.ValidAfter != wantAfter || cert.ValidBefore != wantAfter+3600 {
		t.Errorf("valid %d..%d, want %d..%d", cert.ValidAfter, cert.ValidBefore, wantAfter, wantAfter+3600)
	}
	if !bytes.Equal(cert.Key.Marshal(), user.PublicKey().Marshal()) {
		t.Error("certificate is for another key")
	}
	checker := ssh.CertChecker{
		IsUserAuthority: func(k ssh.PublicKey) bool { return bytes.Equal(k.Marshal(), ca.PublicKey().Marshal()) },
		Clock:           func() time.Time { return testNow },
	}
	if err := checker.CheckCert("alice@n1", cert); err != nil {
		t.Errorf("CheckCert(alice@n1): %v", err)
	}
	if err := checker.CheckCert("alice@n2", cert); err == nil {
		t.Error("CheckCert(alice@n2) accepted a certificate for n1")
	}
}

// TestIssueNeverOutlivesTheCredential: a credential ending in 10 minutes
// (with a fraction of a second) ends the certificate at its whole second.
func TestIssueNeverOutlivesTheCredential(t *testing.T) {
	ca, _ := newSigner(t)
	user, _ := newSigner(t)
	req := request(user.PublicKey(), 7)
	req.NotAfter = testNow.Add(10*time.Minute + 700*time.Millisecond)
	cert, err := Issue(ca, req, testNow)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cert.ValidBefore, uint64(req.NotAfter.Unix()); got != want {
		t.Fatalf("valid before %d, want the credential's end %d", got, want)
	}
}

// TestIssueAcceptsKeyTypes: Ed25519, ECDSA and RSA of 2048 bits, with a
// comment and with a CRLF ending.
func TestIssueAcceptsKeyTypes(t *testing.T) {
	ca, _ := newSigner(t)
	user, _ := newSigner(t)
	ed := bytes.TrimSuffix(authorizedLine(user.PublicKey()), []byte("\n"))
	for name, line := range map[string][]byte{
		"ed25519":      ed,
		"ed25519-crlf": append(append([]byte{}, ed...), "\r\n"...),
		"comment":      append(append([]byte{}, ed...), " alice@laptop\n"...),
		"ecdsa-384":    readKey(t, "ec384.pub"),
		"rsa-2048":     readKey(t, "rsa2048.pub"),
	} {
		req := request(user.PublicKey(), 1)
		req.PublicKey = line
		if _, err := Issue(ca, req, testNow); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestIssueRefusesBadPublicKeys: each bad key is refused INVALID_INPUT with
// its own reason. "junk line, then a key" is the case ssh.ParseAuthorizedKey
// alone accepts (it skips lines it cannot parse).
func TestIssueRefusesBadPublicKeys(t *testing.T) {
	ca, _ := newSigner(t)
	user, _ := newSigner(t)
	good := authorizedLine(user.PublicKey())
	const (
		oneLine = "ssh-key-malformed: public key must be one line without control characters"
		notKey  = "ssh-key-malformed: not an SSH public key"
	)
	cases := []struct {
		name string
		key  []byte
		msg  string
	}{
		{"empty", nil, "ssh-key-malformed: public key is empty"},
		{"too long", append(bytes.TrimSpace(good), bytes.Repeat([]byte("x"), MaxPublicKeyLine)...), "ssh-key-malformed: public key line is over 8192 bytes"},
		{"not a key", []byte("hello world\n"), notKey},
		{"bad base64", []byte("ssh-ed25519 AAAA!!!!\n"), notKey},
		{"type mismatch", append([]byte("ssh-rsa "), bytes.TrimPrefix(good, []byte("ssh-ed25519 "))...), notKey},
		{"comment only", []byte("# a comment\n"), notKey},
		{"junk line, then a key", append([]byte("junk\n"), good...), oneLine},
		{"two keys", append(append([]byte{}, good...), good...), oneLine},
		{"key, then junk line", append(append([]byte{}, good...), "junk"...), oneLine},
		{"NUL in comment", append(bytes.TrimSpace(good), " a\x00b"...), oneLine},
		{"restrict option", append([]byte("restrict "), good...), "ssh-key-malformed: public key must not carry authorized_keys options"},
		{"command option", append([]byte(`command="sh" `), good...), "ssh-key-malformed: public key must not carry authorized_keys options"},
		{"certificate", readKey(t, "ed25519-cert.pub"), "ssh-key-is-certificate: a certificate is not accepted as a public key"},
		{"DSA", readKey(t, "dsa.pub"), "ssh-key-type-refused: key type must be ssh-ed25519, ecdsa-sha2-nistp256/384/521, a security key of those, or ssh-rsa"},
		{"RSA 1024", readKey(t, "rsa1024.pub"), "ssh-key-too-weak: RSA keys must have 2048 to 16384 bits"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := request(user.PublicKey(), 1)
			req.PublicKey = c.key
			_, err := Issue(ca, req, testNow)
			wantRefusal(t, err, errs.InvalidInput, c.msg)
		})
	}
}

// TestIssueRefusesBadAccountsNodesSerialsAndExpiry: the rest of the
// request, each with its code and exact message.
func TestIssueRefusesBadAccountsNodesSerialsAndExpiry(t *testing.T) {
	ca, _ := newSigner(t)
	user, _ := newSigner(t)
	const (
		account = "ssh-account-invalid: account must match ^[a-z_][a-z0-9_-]{0,31}$"
		node    = "ssh-node-invalid: " + ids.NameRule
		expired = "ssh-credential-expired: the caller's credential has expired"
	)
	cases := []struct {
		name string
		edit func(*Request)
		msg  string
	}{
		{"account empty", func(r *Request) { r.Account = "" }, account},
		{"account option", func(r *Request) { r.Account = "-oProxyCommand=sh" }, account},
		{"account percent", func(r *Request) { r.Account = "a%u" }, account},
		{"account space", func(r *Request) { r.Account = "a b" }, account},
		{"account at", func(r *Request) { r.Account = "a@n2" }, account},
		{"account upper", func(r *Request) { r.Account = "Alice" }, account},
		{"account slash", func(r *Request) { r.Account = "a/b" }, account},
		{"account too long", func(r *Request) { r.Account = strings.Repeat("a", 33) }, account},
		{"node empty", func(r *Request) { r.NodeID = "" }, node},
		{"node space", func(r *Request) { r.NodeID = "n 1" }, node},
		{"node at", func(r *Request) { r.NodeID = "n1@n2" }, node},
		{"node comma", func(r *Request) { r.NodeID = "n1,n2" }, node},
		{"node option", func(r *Request) { r.NodeID = "-n1" }, node},
		{"serial zero", func(r *Request) { r.Serial = 0 }, "ssh-serial-zero: serial must not be 0 (a KRL cannot revoke it)"},
		{"credential ended", func(r *Request) { r.NotAfter = testNow.Add(-time.Second) }, expired},
		{"credential ends now", func(r *Request) { r.NotAfter = testNow }, expired},
		{"credential ends this second", func(r *Request) { r.NotAfter = testNow.Add(400 * time.Millisecond) }, expired},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := request(user.PublicKey(), 1)
			c.edit(&req)
			_, err := Issue(ca, req, testNow)
			wantRefusal(t, err, errs.InvalidInput, c.msg)
		})
	}
	// The longest account name is fine.
	req := request(user.PublicKey(), 1)
	req.Account = "_" + strings.Repeat("a", 31)
	if _, err := Issue(ca, req, testNow); err != nil {
		t.Errorf("32-character account: %v", err)
	}
}

// TestIssueRefusesBadCA: no CA, or a certificate as the CA.
func TestIssueRefusesBadCA(t *testing.T) {
	user, _ := newSigner(t)
	_, err := Issue(nil, request(user.PublicKey(), 1), testNow)
	wantRefusal(t, err, errs.InvalidConfig, "ssh-ca-invalid: no certificate authority configured")

	ca, _ := newSigner(t)
	cert, err := Issue(ca, request(user.PublicKey(), 1), testNow)
	if err != nil {
		t.Fatal(err)
	}
	certSigner, err := ssh.NewCertSigner(cert, user)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Issue(certSigner, request(user.PublicKey(), 2), testNow)
	wantRefusal(t, err, errs.InvalidConfig, "ssh-ca-invalid: the certificate authority is a certificate, not a key")
}

// TestSSHKeygenShowsTheCertificate: the real ssh-keygen -L reads the
// certificate as a user certificate, valid for at most 1 h, for the one
// principal <account>@<nodeId>, with no critical options and permit-pty
// as its only extension.
func TestSSHKeygenShowsTheCertificate(t *testing.T) {
	openssh(t, "/usr/bin/ssh-keygen")
	ca, _ := newSigner(t)
	user, _ := newSigner(t)
	cert, err := Issue(ca, request(user.PublicKey(), 9001), testNow)
	if err != nil {
		t.Fatal(err)
	}
	path := writeFile(t, t.TempDir(), "id-cert.pub", ssh.MarshalAuthorizedKey(cert), 0o644)
	out, code := sshKeygen(t, "-L", "-f", path)
	if code != 0 {
		t.Fatalf("ssh-keygen -L: exit %d\n%s", code, out)
	}
	for _, want := range []string{
		"Type: ssh-ed25519-cert-v01@openssh.com user certificate",
		"Serial: 9001",
		"Key ID: \"bc-break-glass serial=9001 account=alice node=n1\"",
		"Critical Options: (none)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("ssh-keygen -L lacks %q:\n%s", want, out)
		}
	}
	wantList(t, out, "Principals", []string{"alice@n1"})
	wantList(t, out, "Extensions", []string{"permit-pty"})
	m := regexp.MustCompile(`Valid: from (\S+) to (\S+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no validity in:\n%s", out)
	}
	from, err1 := time.Parse("2006-01-02T15:04:05", m[1])
	to, err2 := time.Parse("2006-01-02T15:04:05", m[2])
	if err1 != nil || err2 != nil {
		t.Fatalf("validity %q: %v %v", m[0], err1, err2)
	}
	if d := to.Sub(from); d <= 0 || d > time.Hour {
		t.Errorf("validity %s, want at most 1h", d)
	}
	if !from.Before(testNow) || to.Before(testNow) {
		t.Errorf("validity %s..%s does not cover the signing time %s", from, to, testNow)
	}
}

// wantList checks that ssh-keygen -L's indented list under header is
// exactly want.
func wantList(t *testing.T, out, header string, want []string) {
	t.Helper()
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		if strings.TrimSpace(l) != header+":" {
			continue
		}
		var got []string
		for _, item := range lines[i+1:] {
			if !strings.HasPrefix(item, "                ") { // items are indented deeper than headers
				break
			}
			got = append(got, strings.TrimSpace(item))
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s = %q, want %q", header, got, want)
		}
		return
	}
	t.Errorf("no %s in:\n%s", header, out)
}
