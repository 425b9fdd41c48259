package hostinstall

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// Account is the bcd system account as /etc/passwd and /etc/group record it.
type Account struct {
	UID, GID int
}

// passwdEntry is one /etc/passwd line's name, uid and primary gid.
type passwdEntry struct {
	Name     string
	UID, GID int
}

// groupEntry is one /etc/group line's name, gid and members.
type groupEntry struct {
	Name    string
	GID     int
	Members []string
}

// accountDB is a root's /etc/passwd and /etc/group, parsed.
type accountDB struct {
	Users  []passwdEntry
	Groups []groupEntry
}

// readAccounts parses root's etc/passwd and etc/group; a missing file is
// empty. Lines that do not parse are skipped, as the C library does.
func readAccounts(root string) (accountDB, error) {
	var db accountDB
	err := eachLine(join(root, "/etc/passwd"), func(f []string) {
		if len(f) >= 4 {
			uid, e1 := strconv.Atoi(f[2])
			gid, e2 := strconv.Atoi(f[3])
			if e1 == nil && e2 == nil {
				db.Users = append(db.Users, passwdEntry{Name: f[0], UID: uid, GID: gid})
			}
		}
	})
	if err != nil {
		return db, err
	}
	err = eachLine(join(root, "/etc/group"), func(f []string) {
		if len(f) >= 3 {
			gid, e := strconv.Atoi(f[2])
			if e != nil {
				return
			}
			g := groupEntry{Name: f[0], GID: gid}
			if len(f) >= 4 && f[3] != "" {
				g.Members = strings.Split(f[3], ",")
			}
			db.Groups = append(db.Groups, g)
		}
	})
	return db, err
}

// eachLine calls fn with the colon-separated fields of each line of path.
func eachLine(path string, fn func([]string)) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read accounts: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		fn(strings.Split(l, ":"))
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read accounts %s: %w", path, err)
	}
	return nil
}

// user returns the named user.
func (db accountDB) user(name string) (passwdEntry, bool) {
	for _, u := range db.Users {
		if u.Name == name {
			return u, true
		}
	}
	return passwdEntry{}, false
}

// group returns the named group.
func (db accountDB) group(name string) (groupEntry, bool) {
	for _, g := range db.Groups {
		if g.Name == name {
			return g, true
		}
	}
	return groupEntry{}, false
}

// freeSystemID returns the highest id in [100, 999] that no user has as
// uid and no group as gid (as useradd --system counts down), so the
// account's uid and gid can be the same number.
func (db accountDB) freeSystemID() (int, error) {
	used := map[int]bool{}
	for _, u := range db.Users {
		used[u.UID] = true
	}
	for _, g := range db.Groups {
		used[g.GID] = true
	}
	for id := 999; id >= 100; id-- {
		if !used[id] {
			return id, nil
		}
	}
	return 0, errors.New("no free system uid and gid below 1000")
}

// ensureAccountInTree makes the bcd account and group in root's etc/passwd
// and etc/group (creating the files when missing) unless they exist, with
// no supplementary group, no home and no login shell. It reports whether
// it changed anything.
func ensureAccountInTree(root string) (Account, bool, error) {
	db, err := readAccounts(root)
	if err != nil {
		return Account{}, false, err
	}
	u, uok := db.user(NodeUser)
	g, gok := db.group(NodeUser)
	if uok && gok {
		return Account{UID: u.UID, GID: g.GID}, false, nil
	}
	if uok != gok {
		return Account{}, false, fmt.Errorf("%s has the %s user or group but not both: fix it by hand", root, NodeUser)
	}
	id, err := db.freeSystemID()
	if err != nil {
		return Account{}, false, err
	}
	if err := ensureDir(join(root, "/etc"), 0o755, 0, 0, false); err != nil {
		return Account{}, false, err
	}
	pw := fmt.Sprintf("%s:x:%d:%d:Better Compute node agent:%s:%s\n", NodeUser, id, id, nonexistentHome, nologinShell)
	if err := appendLine(join(root, "/etc/passwd"), pw, 0o644); err != nil {
		return Account{}, false, err
	}
	if err := appendLine(join(root, "/etc/group"), fmt.Sprintf("%s:x:%d:\n", NodeUser, id), 0o644); err != nil {
		return Account{}, false, err
	}
	return Account{UID: id, GID: id}, true, nil
}

// appendLine appends line to path, creating it with mode, after a
// newline if the file does not end in one.
func appendLine(path, line string, mode os.FileMode) error {
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("append %s: %w", path, err)
	}
	if len(old) > 0 && old[len(old)-1] != '\n' {
		line = "\n" + line
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, mode)
	if err != nil {
		return fmt.Errorf("append %s: %w", path, err)
	}
	if _, err := f.WriteString(line); err != nil {
		f.Close()
		return fmt.Errorf("append %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("append %s: %w", path, err)
	}
	return nil
}

// useraddArgv is the fixed command that makes the account on a live
// system: a system account with its own group, no home, no login shell,
// and no supplementary group.
func useraddArgv() []string {
	return []string{"useradd", "--system", "--no-create-home", "--home-dir", nonexistentHome,
		"--shell", nologinShell, "--user-group", NodeUser}
}

// ensureAccountLive runs useradd when the account is missing from
// /etc/passwd, then reads its ids back (the gid is the bcd group's).
func ensureAccountLive(ctx context.Context) (Account, bool, error) {
	acct, ok, err := liveAccount()
	if err != nil || ok {
		return acct, false, err
	}
	argv := useraddArgv()
	if out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput(); err != nil {
		return Account{}, false, fmt.Errorf("useradd: %w: %s", err, strings.TrimSpace(string(out)))
	}
	acct, ok, err = liveAccount()
	if err != nil {
		return Account{}, false, err
	}
	if !ok {
		return Account{}, false, fmt.Errorf("useradd ran but /etc/passwd and /etc/group lack %s", NodeUser)
	}
	return acct, true, nil
}

// liveAccount reads the bcd user and group from /etc/passwd and /etc/group.
func liveAccount() (Account, bool, error) {
	db, err := readAccounts("/")
	if err != nil {
		return Account{}, false, err
	}
	u, uok := db.user(NodeUser)
	g, gok := db.group(NodeUser)
	if uok != gok {
		return Account{}, false, fmt.Errorf("the %s user or group exists but not both: fix it by hand", NodeUser)
	}
	return Account{UID: u.UID, GID: g.GID}, uok, nil
}
