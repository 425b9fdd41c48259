package sshca

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/ids"
)

// wantContent checks a file's exact content and permission bits.
func wantContent(t *testing.T, path string, content []byte, mode fs.FileMode) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, content) {
		t.Errorf("%s = %q, want %q", path, got, content)
	}
	wantMode(t, path, mode)
}

// wantMode checks path's permission bits.
func wantMode(t *testing.T, path string, mode fs.FileMode) {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != mode {
		t.Errorf("%s mode %o, want %o", path, st.Mode().Perm(), mode)
	}
}

// entries lists dir's names.
func entries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

// TestWriteSSHDFiles: the CA key line, one principals file per account
// naming this node only, and the KRL, with modes 0644/0755 even where
// the directories were world-writable; a file of an account not listed is
// removed, and a second write drops the file of a removed account.
func TestWriteSSHDFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ssh")
	if err := os.MkdirAll(filepath.Join(dir, PrincipalsDir), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, PrincipalsDir), "mallory", []byte("mallory@n1\n"), 0o644)
	ca, _ := newSigner(t)
	k := KRL{Version: 2, Serials: []uint64{11}, Generated: testNow}
	f := Files{CA: ca.PublicKey(), NodeID: "n1", Accounts: []string{"alice", "bob"}, KRL: k}
	if err := WriteSSHDFiles(dir, f); err != nil {
		t.Fatal(err)
	}
	k.CA = ca.PublicKey()
	wantKRL, err := k.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	wantMode(t, dir, 0o755)
	wantMode(t, filepath.Join(dir, PrincipalsDir), 0o755)
	wantContent(t, filepath.Join(dir, CAKeyFile), ssh.MarshalAuthorizedKey(ca.PublicKey()), 0o644)
	wantContent(t, filepath.Join(dir, KRLFile), wantKRL, 0o644)
	wantContent(t, filepath.Join(dir, PrincipalsDir, "alice"), []byte("alice@n1\n"), 0o644)
	wantContent(t, filepath.Join(dir, PrincipalsDir, "bob"), []byte("bob@n1\n"), 0o644)
	if got := entries(t, filepath.Join(dir, PrincipalsDir)); !slices.Equal(got, []string{"alice", "bob"}) {
		t.Errorf("principals = %q, want [alice bob] (mallory's file removed)", got)
	}
	if got := entries(t, dir); !slices.Equal(got, []string{PrincipalsDir, KRLFile, CAKeyFile}) {
		t.Errorf("dir = %q, want exactly the three entries", got)
	}

	f.Accounts = []string{"bob"}
	if err := WriteSSHDFiles(dir, f); err != nil {
		t.Fatal(err)
	}
	if got := entries(t, filepath.Join(dir, PrincipalsDir)); !slices.Equal(got, []string{"bob"}) {
		t.Errorf("after removing alice, principals = %q, want [bob]", got)
	}
}

// TestWriteSSHDFilesRefusals: a bad dir, CA, node, account, or a KRL of
// another CA is refused INVALID_CONFIG and nothing is written.
func TestWriteSSHDFilesRefusals(t *testing.T) {
	ca, _ := newSigner(t)
	other, _ := newSigner(t)
	base := t.TempDir()
	good := func() Files {
		return Files{CA: ca.PublicKey(), NodeID: "n1", Accounts: []string{"alice"}, KRL: KRL{Serials: []uint64{3}}}
	}
	const dirMsg = "sshd-dir-invalid: sshd file directory must be an absolute, clean path without spaces, quotes, '#' or '%'"
	cases := []struct {
		name string
		dir  string
		edit func(*Files)
		msg  string
	}{
		{"relative dir", "ssh", nil, dirMsg},
		{"unclean dir", base + "/a/../ssh", nil, dirMsg},
		{"space in dir", base + "/s sh", nil, dirMsg},
		{"percent in dir", base + "/%u", nil, dirMsg},
		{"hash in dir", base + "/#ssh", nil, dirMsg},
		{"quote in dir", base + "/'ssh", nil, dirMsg},
		{"no CA", "", func(f *Files) { f.CA = nil }, "ssh-ca-invalid: no certificate authority configured"},
		{"bad node", "", func(f *Files) { f.NodeID = "n1 n2" }, "ssh-node-invalid: node id: " + ids.NameRule},
		{"bad account", "", func(f *Files) { f.Accounts = []string{"alice", "../etc"} }, "ssh-account-invalid: account must match ^[a-z_][a-z0-9_-]{0,31}$"},
		{"KRL of another CA", "", func(f *Files) { f.KRL.CA = other.PublicKey() }, "sshd-krl-ca-mismatch: the KRL is for another certificate authority"},
		{"KRL serial 0", "", func(f *Files) { f.KRL.Serials = []uint64{0} }, "ssh-serial-zero: serial 0 cannot be revoked in a KRL"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir, f := c.dir, good()
			if dir == "" {
				dir = filepath.Join(base, "ssh")
			}
			if c.edit != nil {
				c.edit(&f)
			}
			wantRefusal(t, WriteSSHDFiles(dir, f), errs.InvalidConfig, c.msg)
			if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s exists after a refusal (err %v)", dir, err)
			}
		})
	}
}

// TestSSHDConfigSnippet: the three directives, pointing at the files.
func TestSSHDConfigSnippet(t *testing.T) {
	got, err := SSHDConfigSnippet("/etc/ssh/bettercompute")
	if err != nil {
		t.Fatal(err)
	}
	want := "# Better Compute break-glass SSH: certificates from one CA, principals per account, a KRL.\n" +
		"TrustedUserCAKeys /etc/ssh/bettercompute/trusted_user_ca_keys.pub\n" +
		"AuthorizedPrincipalsFile /etc/ssh/bettercompute/principals/%u\n" +
		"RevokedKeys /etc/ssh/bettercompute/revoked_keys.krl\n"
	if got != want {
		t.Errorf("snippet:\n%s\nwant:\n%s", got, want)
	}
	_, err = SSHDConfigSnippet("/etc/ssh/a b")
	wantRefusal(t, err, errs.InvalidConfig, "sshd-dir-invalid: sshd file directory must be an absolute, clean path without spaces, quotes, '#' or '%'")
}

// TestCheckDistinct: the same key as break-glass and sandbox CA (even
// parsed separately) is refused INVALID_CONFIG; different keys, or a CA
// not configured, pass.
func TestCheckDistinct(t *testing.T) {
	a, _ := newSigner(t)
	b, _ := newSigner(t)
	same, _, _, _, err := ssh.ParseAuthorizedKey(ssh.MarshalAuthorizedKey(a.PublicKey()))
	if err != nil {
		t.Fatal(err)
	}
	wantRefusal(t, CheckDistinct(a.PublicKey(), same), errs.InvalidConfig,
		"ssh-cas-not-distinct: the break-glass SSH CA and the sandbox SSH CA must be different keys")
	if err := CheckDistinct(a.PublicKey(), b.PublicKey()); err != nil {
		t.Errorf("different keys: %v", err)
	}
	if err := CheckDistinct(a.PublicKey(), nil); err != nil {
		t.Errorf("no sandbox CA: %v", err)
	}
}
