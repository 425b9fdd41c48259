package sshca

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/bettercompute/bettercompute/internal/errs"
)

// issueTo issues a certificate with serial from ca and writes it to dir,
// returning its path.
func issueTo(t *testing.T, dir string, ca ssh.Signer, serial uint64) string {
	t.Helper()
	user, _ := newSigner(t)
	cert, err := Issue(ca, request(user.PublicKey(), serial), testNow)
	if err != nil {
		t.Fatal(err)
	}
	return writeFile(t, dir, "cert-"+hex.EncodeToString(binary.BigEndian.AppendUint64(nil, serial))+".pub", ssh.MarshalAuthorizedKey(cert), 0o644)
}

// TestKRLHeaderBytes pins the header layout of PROTOCOL.krl and the
// certificates section, byte for byte, independently of ssh-keygen.
func TestKRLHeaderBytes(t *testing.T) {
	ca, _ := newSigner(t)
	k := KRL{CA: ca.PublicKey(), Version: 3, Serials: []uint64{9, 2, 9}, Generated: time.Unix(1700000000, 0)}
	got, err := k.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	var want []byte
	want = append(want, "SSHKRL\n\x00"...)
	want = binary.BigEndian.AppendUint32(want, 1)          // format version
	want = binary.BigEndian.AppendUint64(want, 3)          // krl_version
	want = binary.BigEndian.AppendUint64(want, 1700000000) // generated_date
	want = binary.BigEndian.AppendUint64(want, 0)          // flags
	want = binary.BigEndian.AppendUint32(want, 0)          // reserved ""
	want = binary.BigEndian.AppendUint32(want, 0)          // comment ""
	blob := ca.PublicKey().Marshal()
	var section []byte
	section = binary.BigEndian.AppendUint32(section, uint32(len(blob)))
	section = append(section, blob...)
	section = binary.BigEndian.AppendUint32(section, 0) // reserved
	section = append(section, 0x20)                     // serial list: sorted, deduplicated
	section = binary.BigEndian.AppendUint32(section, 16)
	section = binary.BigEndian.AppendUint64(section, 2)
	section = binary.BigEndian.AppendUint64(section, 9)
	want = append(want, 1) // KRL_SECTION_CERTIFICATES
	want = binary.BigEndian.AppendUint32(want, uint32(len(section)))
	want = append(want, section...)
	if !bytes.Equal(got, want) {
		t.Fatalf("KRL bytes:\n%x\nwant:\n%x", got, want)
	}
}

// TestSSHKeygenReportsRevokedSerials: the real ssh-keygen -Q reads the KRL
// and reports the revoked serial REVOKED (exit 1), another serial of the
// same CA ok, and the same serial from another CA ok (a KRL section is
// for one CA). ssh-keygen -Q -l lists the KRL as written.
func TestSSHKeygenReportsRevokedSerials(t *testing.T) {
	openssh(t, "/usr/bin/ssh-keygen")
	dir := t.TempDir()
	ca, _ := newSigner(t)
	other, _ := newSigner(t)
	krl, err := KRL{CA: ca.PublicKey(), Version: 7, Serials: []uint64{5, 1 << 40}, Generated: testNow}.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	krlPath := writeFile(t, dir, "revoked.krl", krl, 0o644)

	revoked := issueTo(t, dir, ca, 5)
	revokedHigh := issueTo(t, dir, ca, 1<<40)
	fine := issueTo(t, dir, ca, 6)
	otherDir := t.TempDir()
	otherCA := issueTo(t, otherDir, other, 5)

	for _, c := range []struct {
		path string
		want string
		code int
	}{
		{revoked, ": REVOKED", 1},
		{revokedHigh, ": REVOKED", 1},
		{fine, ": ok", 0},
		{otherCA, ": ok", 0},
	} {
		// One line: "<path> (<comment>): REVOKED" or "...: ok".
		out, code := sshKeygen(t, "-Q", "-f", krlPath, c.path)
		line := strings.TrimSuffix(out, "\n")
		if code != c.code || strings.Contains(line, "\n") || !strings.HasPrefix(line, c.path) || !strings.HasSuffix(line, c.want) {
			t.Errorf("ssh-keygen -Q %s: exit %d %q, want exit %d %q", c.path, code, out, c.code, c.want)
		}
	}

	out, code := sshKeygen(t, "-Q", "-l", "-f", krlPath)
	if code != 0 {
		t.Fatalf("ssh-keygen -Q -l: exit %d\n%s", code, out)
	}
	for _, want := range []string{
		"# KRL version 7\n", "# Generated at 20300506T070809\n",
		"# CA key ssh-ed25519 " + ssh.FingerprintSHA256(ca.PublicKey()) + "\nserial: 5\nserial: 1099511627776\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("ssh-keygen -Q -l lacks %q:\n%s", want, out)
		}
	}
}

// TestSSHKeygenReadsLargeAndEmptyKRLs: a KRL with more serials than fit in
// one serial list subsection, and a KRL with none, both load; the empty
// one revokes nothing.
func TestSSHKeygenReadsLargeAndEmptyKRLs(t *testing.T) {
	openssh(t, "/usr/bin/ssh-keygen")
	dir := t.TempDir()
	ca, _ := newSigner(t)
	var many []uint64
	for s := uint64(1); s <= krlMaxSerialsPerBlock+10; s++ {
		many = append(many, s*3)
	}
	last := many[len(many)-1]
	big, err := KRL{CA: ca.PublicKey(), Version: 1, Serials: many}.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	empty, err := KRL{CA: ca.PublicKey(), Version: 1}.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	bigPath := writeFile(t, dir, "big.krl", big, 0o644)
	emptyPath := writeFile(t, dir, "empty.krl", empty, 0o644)
	lastCert := issueTo(t, dir, ca, last)
	notInList := issueTo(t, dir, ca, last+1)
	if out, code := sshKeygen(t, "-Q", "-f", bigPath, lastCert); code != 1 || !strings.Contains(out, "REVOKED") {
		t.Errorf("serial %d in the second subsection: exit %d %q, want REVOKED", last, code, out)
	}
	if out, code := sshKeygen(t, "-Q", "-f", bigPath, notInList); code != 0 {
		t.Errorf("serial %d not listed: exit %d %q, want ok", last+1, code, out)
	}
	if out, code := sshKeygen(t, "-Q", "-f", emptyPath, lastCert); code != 0 {
		t.Errorf("empty KRL: exit %d %q, want ok", code, out)
	}
}

// TestKRLMarshalRefusals: no CA, a certificate as CA, and serial 0 (which
// OpenSSH refuses to load, failing every key closed) are refused.
func TestKRLMarshalRefusals(t *testing.T) {
	ca, _ := newSigner(t)
	_, err := KRL{Serials: []uint64{1}}.Marshal()
	wantRefusal(t, err, errs.InvalidConfig, "ssh-ca-invalid: KRL needs the certificate authority's public key")

	user, _ := newSigner(t)
	cert, err := Issue(ca, request(user.PublicKey(), 1), testNow)
	if err != nil {
		t.Fatal(err)
	}
	_, err = KRL{CA: cert, Serials: []uint64{1}}.Marshal()
	wantRefusal(t, err, errs.InvalidConfig, "ssh-ca-invalid: the certificate authority is a certificate, not a key")

	_, err = KRL{CA: ca.PublicKey(), Serials: []uint64{4, 0}}.Marshal()
	wantRefusal(t, err, errs.InvalidConfig, "ssh-serial-zero: serial 0 cannot be revoked in a KRL")
}
