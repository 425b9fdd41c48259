package hostinstall

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/bettercompute/bettercompute/internal/hosthelper/helperconfig"
)

// Finding codes: stable, so operators and tests match on them.
const (
	FindAccountMissing     = "account-missing"       // no bcd user or group
	FindAccountRoot        = "account-root"          // bcd's uid or primary gid is 0
	FindAccountLogin       = "account-login"         // bcd has a login shell
	FindGroupRootEquiv     = "group-root-equivalent" // bcd is in a group listed by RootEquivalentGroups, or of gid 0
	FindGroupSupplementary = "group-supplementary"   // bcd is in another group (the install adds none)
	FindGroupShared        = "group-shared"          // another account is in the bcd group, so it can reach the helper's socket
	FindDirMissing         = "dir-missing"           // a directory the install makes is missing
	FindDirMode            = "dir-mode"              // ... has another mode or owner than the install gives it
	FindDirWritable        = "dir-writable"          // a directory on the way to root's files is writable by group or other
	FindDirOwner           = "dir-not-root"          // ... is not root's
	FindPathSymlink        = "path-symlink"          // ... is a symlink or not a directory
	FindFileWritable       = "file-writable"         // a unit, helper.toml or the bcd binary is not root's or is group/other writable
	FindConfigInvalid      = "config-invalid"        // helper.toml is missing or does not load
	FindRootsUnpinned      = "roots-unpinned"        // helper.toml pins no command-signing root
	FindUnitMissing        = "unit-missing"          // a unit file is missing
	FindUnitHardening      = "unit-hardening"        // a required line is missing or set otherwise (in the unit or a drop-in)
	FindUnitForbidden      = "unit-forbidden"        // a setting that undoes the separation (SupplementaryGroups, a '+' or '!' Exec prefix)
	FindUnitExec           = "unit-exec"             // the unit's ExecStart binary does not exist
	FindSocketMode         = "socket-mode"           // the helper's socket is not 0660 root:bcd
	FindHelperUnreachable  = "helper-unreachable"    // the helper does not answer ping
)

// RootEquivalentGroups are the groups bcd must not be in, and why: each
// gives root, or a secret or device root keeps from the node.
//   - root: root's own group (root-owned group-writable files).
//   - sudo, wheel, admin: sudo to root.
//   - adm, systemd-journal: every log, with the secrets services log;
//     not root itself, but the node never needs them.
//   - disk: raw block devices, so any file's blocks.
//   - kmem: /dev/mem and /dev/kmem.
//   - shadow: the password hashes.
//   - staff: on Debian, writes /usr/local, where root runs bcd from.
//   - docker, lxd, incus-admin, libvirt: start a privileged container or
//     VM with the host's disk.
//   - kvm: /dev/kvm's ioctl surface; the node runs no VM itself.
//   - tss: the TPM, whose commands the kernel does not filter (clear it,
//     change its authorization), breaking root's sealed secrets.
func RootEquivalentGroups() []string {
	return []string{"root", "sudo", "wheel", "admin", "adm", "systemd-journal", "disk", "kmem", "shadow", // archtest:not-tenant (a group name)
		"staff", "docker", "lxd", "incus-admin", "libvirt", "kvm", "tss"}
}

// Finding is one problem doctor found.
type Finding struct {
	Code   string `json:"code"`
	Path   string `json:"path,omitempty"`
	Detail string `json:"detail"`
}

// String is the finding as doctor prints it: CODE: PATH: detail.
func (f Finding) String() string {
	if f.Path == "" {
		return f.Code + ": " + f.Detail
	}
	return f.Code + ": " + f.Path + ": " + f.Detail
}

// DoctorOptions says what to check.
type DoctorOptions struct {
	// Root is the installed tree; "" is the live system, where doctor
	// also pings the helper and checks the units' binaries exist.
	Root string
}

// doctor accumulates findings.
type doctor struct {
	root     string
	findings []Finding
	seen     map[string]bool
}

// add records a finding once.
func (d *doctor) add(code, path, format string, args ...any) {
	f := Finding{Code: code, Path: path, Detail: fmt.Sprintf(format, args...)}
	if d.seen[f.String()] {
		return
	}
	d.seen[f.String()] = true
	d.findings = append(d.findings, f)
}

// Doctor checks an installed node and returns its findings, none when
// the install is as `bcd install --unprivileged` leaves it.
func Doctor(ctx context.Context, o DoctorOptions) []Finding {
	d := &doctor{root: o.Root, seen: map[string]bool{}}
	acct := d.checkAccount()
	for _, target := range []string{ConfigDir, HelperStateDir, HelperRunDir, UnitDir, filepath.Dir(BinPath), NodeDataDir} {
		d.checkWay(target)
	}
	d.checkDir(ConfigDir, 0o750, 0, acct.GID)
	d.checkDir(NodeDataDir, 0o700, acct.UID, acct.GID)
	d.checkDir(HelperStateDir, 0o700, 0, 0)
	cfg := d.checkConfig()
	d.checkUnit(NodeUnitPath, nodeRequired(), nodeForbidden())
	d.checkUnit(HelperUnitPath, helperRequired(), nil)
	if o.Root == "" {
		d.rootFile(BinPath, false)
		d.checkSocket(cfg.Socket, acct.GID)
		d.checkPing(ctx, cfg.Socket)
	} else if _, err := os.Lstat(d.path(BinPath)); err == nil {
		d.rootFile(BinPath, false)
	}
	return d.findings
}

// path is an installed path under the root.
func (d *doctor) path(p string) string { return join(d.root, p) }

// checkAccount checks the bcd account: present, not root, no login, in
// no group but its own, and alone in its group. Without it the returned
// ids are -1, which no directory has.
func (d *doctor) checkAccount() Account {
	none := Account{UID: -1, GID: -1}
	db, err := readAccounts(d.rootOrSlash())
	if err != nil {
		d.add(FindAccountMissing, d.path("/etc/passwd"), "%v", err)
		return none
	}
	u, uok := db.user(NodeUser)
	g, gok := db.group(NodeUser)
	if !uok || !gok {
		d.add(FindAccountMissing, d.path("/etc/passwd"), "no %s user and group", NodeUser)
		return none
	}
	if u.UID == 0 || u.GID == 0 || g.GID == 0 {
		d.add(FindAccountRoot, d.path("/etc/passwd"), "%s has uid %d, primary gid %d", NodeUser, u.UID, u.GID)
	}
	if sh := loginShell(d.path("/etc/passwd")); sh != nologinShell && sh != "/bin/false" && sh != "/usr/bin/false" && sh != "/sbin/nologin" {
		d.add(FindAccountLogin, d.path("/etc/passwd"), "%s has the login shell %q", NodeUser, sh)
	}
	d.checkGroups(db, u, g)
	return Account{UID: u.UID, GID: g.GID}
}

// checkGroups reports bcd's memberships and the bcd group's other members.
func (d *doctor) checkGroups(db accountDB, u passwdEntry, own groupEntry) {
	equiv := map[string]bool{}
	for _, n := range RootEquivalentGroups() {
		equiv[n] = true
	}
	for _, g := range db.Groups {
		member := false
		for _, m := range g.Members {
			member = member || m == NodeUser
		}
		switch {
		case !member || g.GID == own.GID && g.Name == own.Name:
		case equiv[g.Name] || g.GID == 0:
			d.add(FindGroupRootEquiv, d.path("/etc/group"), "%s is in group %s, which is root-equivalent", NodeUser, g.Name)
		default:
			d.add(FindGroupSupplementary, d.path("/etc/group"), "%s is in group %s (the install adds it to none)", NodeUser, g.Name)
		}
	}
	var others []string
	for _, m := range own.Members {
		if m != NodeUser {
			others = append(others, m)
		}
	}
	for _, o := range db.Users {
		if o.GID == own.GID && o.Name != u.Name {
			others = append(others, o.Name)
		}
	}
	if len(others) > 0 {
		sort.Strings(others)
		d.add(FindGroupShared, d.path("/etc/group"), "group %s also holds %s, who can reach the helper's socket and read helper.toml", own.Name, strings.Join(others, ", "))
	}
}

// loginShell is bcd's shell field in passwd.
func loginShell(passwd string) string {
	shell := ""
	_ = eachLine(passwd, func(f []string) {
		if len(f) >= 7 && f[0] == NodeUser {
			shell = f[6]
		}
	})
	return shell
}

// rootOrSlash is the root for readAccounts.
func (d *doctor) rootOrSlash() string {
	if d.root == "" {
		return "/"
	}
	return d.root
}

// checkWay checks every existing directory from the root down to target:
// a real directory, root's, writable by no one else. A missing one ends
// the walk (doctor reports the directories it makes itself).
func (d *doctor) checkWay(target string) {
	cur := d.rootOrSlash()
	parts := strings.Split(strings.Trim(target, "/"), "/")
	for i := 0; i <= len(parts); i++ {
		if i > 0 {
			cur = filepath.Join(cur, parts[i-1])
		}
		st, err := os.Lstat(cur)
		if errors.Is(err, fs.ErrNotExist) {
			return
		}
		if err != nil {
			d.add(FindPathSymlink, cur, "%v", err)
			return
		}
		if !st.IsDir() {
			d.add(FindPathSymlink, cur, "not a directory (%s) on the way to %s", st.Mode().Type(), target)
			return
		}
		if cur == d.path(NodeDataDir) {
			return // the node's own directory: checkDir checks it
		}
		if own := owner(st); own[0] != 0 {
			d.add(FindDirOwner, cur, "owned by uid %d, not root, on the way to %s", own[0], target)
		}
		if st.Mode().Perm()&0o022 != 0 {
			d.add(FindDirWritable, cur, "mode %04o: writable by group or other, on the way to %s", st.Mode().Perm(), target)
		}
	}
}

// checkDir checks one directory the install makes.
func (d *doctor) checkDir(p string, mode os.FileMode, uid, gid int) {
	path := d.path(p)
	st, err := os.Lstat(path)
	if err != nil {
		d.add(FindDirMissing, path, "%v", err)
		return
	}
	if !st.IsDir() {
		d.add(FindPathSymlink, path, "not a directory (%s)", st.Mode().Type())
		return
	}
	if st.Mode().Perm() != mode || owner(st) != [2]int{uid, gid} {
		own := owner(st)
		d.add(FindDirMode, path, "mode %04o owner %d:%d, want %04o %d:%d", st.Mode().Perm(), own[0], own[1], mode, uid, gid)
	}
}

// rootFile checks that a file root reads or runs is root's and writable
// by no one else; missing is reported only when required.
func (d *doctor) rootFile(p string, required bool) bool {
	path := d.path(p)
	st, err := os.Lstat(path)
	if err != nil {
		if required || !errors.Is(err, fs.ErrNotExist) {
			d.add(FindFileWritable, path, "%v", err)
		}
		return false
	}
	if !st.Mode().IsRegular() {
		d.add(FindFileWritable, path, "not a regular file (%s)", st.Mode().Type())
		return false
	}
	if own := owner(st); own[0] != 0 || st.Mode().Perm()&0o022 != 0 {
		d.add(FindFileWritable, path, "owner uid %d, mode %04o: must be root's and writable by no one else", own[0], st.Mode().Perm())
	}
	return true
}

// checkConfig loads helper.toml and checks its pins; it returns the
// defaults when it does not load.
func (d *doctor) checkConfig() helperconfig.Config {
	path := d.path(ConfigPath)
	if _, err := os.Lstat(path); err != nil {
		d.add(FindConfigInvalid, path, "%v", err)
		return helperconfig.Default()
	}
	d.rootFile(ConfigPath, true)
	b, err := readRegular(path, helperconfig.MaxSize+1)
	if err != nil {
		d.add(FindConfigInvalid, path, "%v", err)
		return helperconfig.Default()
	}
	cfg, err := helperconfig.Parse(b)
	if err != nil {
		d.add(FindConfigInvalid, path, "%v", err)
		return helperconfig.Default()
	}
	if len(cfg.CommandRootSHA256) == 0 {
		d.add(FindRootsUnpinned, path, "command_root_sha256 is empty: no command-signing root is pinned, so the helper checks no signed intent until the node presents a bundle; reinstall with --command-root-sha256")
	}
	return cfg
}
