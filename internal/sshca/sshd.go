package sshca

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/bettercompute/bettercompute/internal/atomicfile"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/ids"
)

// The files WriteSSHDFiles writes under its directory, and their modes.
const (
	CAKeyFile     = "trusted_user_ca_keys.pub" // sshd TrustedUserCAKeys
	PrincipalsDir = "principals"               // sshd AuthorizedPrincipalsFile <dir>/principals/%u
	KRLFile       = "revoked_keys.krl"         // sshd RevokedKeys
	// FileMode: public data, owned by the writer (root on a node), writable
	// by it alone; sshd's StrictModes refuses group- or world-writable ones.
	FileMode fs.FileMode = 0o644
	// DirMode: the same for the directories.
	DirMode fs.FileMode = 0o755
)

// More reasons for refusals, of the sshd side's configuration.
const (
	ReasonDirInvalid     = "sshd-dir-invalid"     // not an absolute, clean path sshd_config can name
	ReasonCAMismatch     = "sshd-krl-ca-mismatch" // the KRL is for another CA than the trusted one
	ReasonCAsNotDistinct = "ssh-cas-not-distinct" // break-glass and sandbox CA are one key
)

// Files is what a node's sshd needs for break-glass access.
type Files struct {
	CA       ssh.PublicKey // the break-glass CA sshd trusts for user certificates
	NodeID   string        // this node: principals name it and no other
	Accounts []string      // the accounts break-glass may log in as
	KRL      KRL           // revoked certificates; KRL.CA nil means CA
}

// WriteSSHDFiles writes f under dir, each file atomically (a reader sees
// the old or the new content), with FileMode and DirMode: the CA's public
// key, one principals file per account holding only "<account>@<nodeId>"
// of this node, and the KRL. The KRL is written first, so a revocation is
// in force before anything else changes; principals files of accounts no
// longer listed are removed last, so dropping an account revokes it. It
// refuses (errs.InvalidConfig) a bad dir, CA, node id, account or KRL and
// writes nothing then. There must be one writer per dir at a time.
func WriteSSHDFiles(dir string, f Files) error {
	if !validDir(dir) {
		return refuse(errs.InvalidConfig, ReasonDirInvalid, "sshd file directory must be an absolute, clean path without spaces, quotes, '#' or '%'")
	}
	r, err := RenderSSHDFiles(f)
	if err != nil {
		return err
	}
	principals := filepath.Join(dir, PrincipalsDir)
	for _, d := range []string{dir, principals} {
		if err := os.MkdirAll(d, DirMode); err != nil {
			return fmt.Errorf("sshca: make %s: %w", d, err)
		}
		if err := os.Chmod(d, DirMode); err != nil { // MkdirAll leaves an existing dir's mode, and umask applies
			return fmt.Errorf("sshca: chmod %s: %w", d, err)
		}
	}
	if err := atomicfile.Write(filepath.Join(dir, KRLFile), r.KRL, FileMode); err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(dir, CAKeyFile), r.CA, FileMode); err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, a := range f.Accounts {
		keep[a] = true
		if err := atomicfile.Write(filepath.Join(principals, a), r.Principals[a], FileMode); err != nil {
			return err
		}
	}
	return removeOthers(principals, keep)
}

// Rendered is the content of the sshd files of a Files: what
// WriteSSHDFiles writes, for a writer that names files by kind and id
// (an unprivileged node's root helper).
type Rendered struct {
	KRL, CA    []byte
	Principals map[string][]byte // account → "<account>@<nodeId>\n"
}

// RenderSSHDFiles checks f as WriteSSHDFiles does and returns the files'
// content; nothing is written.
func RenderSSHDFiles(f Files) (Rendered, error) {
	krl, err := checkFiles(&f)
	if err != nil {
		return Rendered{}, err
	}
	r := Rendered{KRL: krl, CA: ssh.MarshalAuthorizedKey(f.CA), Principals: make(map[string][]byte, len(f.Accounts))}
	for _, a := range f.Accounts {
		r.Principals[a] = []byte(Principal(a, f.NodeID) + "\n")
	}
	return r, nil
}

// checkFiles validates f (filling in the KRL's CA) and returns the KRL's
// bytes, so that nothing is written unless everything is good.
func checkFiles(f *Files) ([]byte, error) {
	if f.CA == nil {
		return nil, refuse(errs.InvalidConfig, ReasonCAInvalid, "no certificate authority configured")
	}
	if _, isCert := f.CA.(*ssh.Certificate); isCert {
		return nil, refuse(errs.InvalidConfig, ReasonCAInvalid, "the certificate authority is a certificate, not a key")
	}
	if !ValidNodeID(f.NodeID) {
		return nil, refuse(errs.InvalidConfig, ReasonNodeInvalid, "node id: "+ids.NameRule)
	}
	for _, a := range f.Accounts {
		if !ValidAccount(a) {
			return nil, refuse(errs.InvalidConfig, ReasonAccountInvalid, "account must match ^[a-z_][a-z0-9_-]{0,31}$")
		}
	}
	if f.KRL.CA == nil {
		f.KRL.CA = f.CA
	}
	if !bytes.Equal(f.KRL.CA.Marshal(), f.CA.Marshal()) {
		return nil, refuse(errs.InvalidConfig, ReasonCAMismatch, "the KRL is for another certificate authority")
	}
	return f.KRL.Marshal()
}

// removeOthers removes every entry of dir whose name is not in keep, then
// fsyncs dir so that a removal (a revoked account) survives a crash.
func removeOthers(dir string, keep map[string]bool) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("sshca: list %s: %w", dir, err)
	}
	removed := false
	for _, e := range entries {
		if keep[e.Name()] {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("sshca: remove stale principals: %w", err)
		}
		removed = true
	}
	if !removed {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sshca: sync %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sshca: sync %s: %w", dir, err)
	}
	return nil
}

// validDir reports whether dir can be named in sshd_config as is: an
// absolute, clean path of printable ASCII without space, quotes, '\\',
// '#' (a comment) or '%' (sshd expands %-tokens in
// AuthorizedPrincipalsFile).
func validDir(dir string) bool {
	if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir {
		return false
	}
	for i := 0; i < len(dir); i++ {
		if c := dir[i]; c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return !strings.ContainsAny(dir, "\"'\\#%")
}

// SSHDConfigSnippet returns the sshd_config lines that make sshd use the
// files WriteSSHDFiles writes under dir. They belong in the global part of
// sshd_config (before any Match block). With StrictModes (the default),
// sshd also wants every directory from dir up to / owned by root and not
// group- or world-writable. It refuses a dir WriteSSHDFiles would refuse.
func SSHDConfigSnippet(dir string) (string, error) {
	if !validDir(dir) {
		return "", refuse(errs.InvalidConfig, ReasonDirInvalid, "sshd file directory must be an absolute, clean path without spaces, quotes, '#' or '%'")
	}
	return "# Better Compute break-glass SSH: certificates from one CA, principals per account, a KRL.\n" +
		"TrustedUserCAKeys " + filepath.Join(dir, CAKeyFile) + "\n" +
		"AuthorizedPrincipalsFile " + filepath.Join(dir, PrincipalsDir) + "/%u\n" +
		"RevokedKeys " + filepath.Join(dir, KRLFile) + "\n", nil
}

// CheckDistinct refuses (errs.InvalidConfig) a configuration where the
// break-glass CA and the sandbox CA are the same key: a certificate for a
// sandbox must never open a node, nor the other way round. A CA that is
// not configured (nil) is distinct from anything.
func CheckDistinct(breakGlass, sandbox ssh.PublicKey) error {
	if breakGlass == nil || sandbox == nil {
		return nil
	}
	if bytes.Equal(breakGlass.Marshal(), sandbox.Marshal()) {
		return refuse(errs.InvalidConfig, ReasonCAsNotDistinct, "the break-glass SSH CA and the sandbox SSH CA must be different keys")
	}
	return nil
}
