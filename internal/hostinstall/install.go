// Package hostinstall installs a node for privilege separation and checks
// one: `bcd install --unprivileged` writes the bcd system account, the two
// systemd units (bcd.service as that account with no capability,
// bcd-helper.service as root), root's helper.toml with the pins, and the
// directories with their owners and modes; `bcd doctor` reads an
// installed node back and reports each thing that would let the node (or
// anyone else) reach root: a group that is root-equivalent, a directory
// others may write on the way to root's files, a unit missing a hardening
// line, roots not pinned, a helper that does not answer.
//
// Both work under a root directory (for tests and packaging) or on the
// live system ("/").
package hostinstall

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/bettercompute/bettercompute/internal/atomicfile"
	"github.com/bettercompute/bettercompute/internal/hosthelper/helperconfig"
)

// Options is what `bcd install --unprivileged` was asked.
type Options struct {
	// Root is the directory to install under; "" is the live system,
	// where the account is made with useradd.
	Root string
	// CommandRootSHA256 are the command-signing roots to pin (hex
	// SHA-256 of each root certificate's DER). Empty keeps the pins an
	// existing helper.toml holds.
	CommandRootSHA256 []string
	// Bin is a bcd binary to install as /usr/local/bin/bcd and pin in
	// exe_sha256; "" installs none.
	Bin string
}

// Action is one thing the install looked at: a path and what it did
// there ("created", "updated" or "unchanged").
type Action struct {
	Path string `json:"path"`
	Did  string `json:"did"`
}

// Result is the whole install: every action, and whether any changed
// something.
type Result struct {
	Actions []Action `json:"actions"`
	Changed bool     `json:"changed"`
	// Warnings are things the install did but doctor will report (roots
	// not pinned).
	Warnings []string `json:"warnings,omitempty"`
}

// Did values.
const (
	DidCreated   = "created"
	DidUpdated   = "updated"
	DidUnchanged = "unchanged"
)

// Install writes an unprivileged node's account, units, config and
// directories under o.Root. Running it again with the same options
// changes nothing and says so.
func Install(ctx context.Context, o Options) (Result, error) {
	for _, p := range o.CommandRootSHA256 {
		c := helperconfig.Default()
		c.CommandRootSHA256 = []string{p}
		if err := c.Validate(); err != nil {
			return Result{}, fmt.Errorf("--command-root-sha256: %w", err)
		}
	}
	var r Result
	acct, changed, err := ensureAccount(ctx, o.Root)
	if err != nil {
		return Result{}, err
	}
	r.add(join(o.Root, "/etc/passwd"), didOf(changed, false))
	exeSum, err := installBin(&r, o)
	if err != nil {
		return Result{}, err
	}
	for _, u := range []struct {
		path, text string
	}{{NodeUnitPath, NodeUnit}, {HelperUnitPath, HelperUnit}} {
		if err := r.file(join(o.Root, u.path), []byte(u.text), 0o644, 0, 0); err != nil {
			return Result{}, err
		}
	}
	if err := r.dir(join(o.Root, ConfigDir), 0o750, 0, acct.GID); err != nil {
		return Result{}, err
	}
	cfg, err := helperConfig(o, exeSum)
	if err != nil {
		return Result{}, err
	}
	if len(cfg.CommandRootSHA256) == 0 {
		r.Warnings = append(r.Warnings, "command-signing roots not pinned: pass --command-root-sha256 (bcd doctor reports roots-unpinned)")
	}
	if err := r.file(join(o.Root, ConfigPath), cfg.Encode(), 0o640, 0, acct.GID); err != nil {
		return Result{}, err
	}
	if err := r.dir(join(o.Root, NodeDataDir), 0o700, acct.UID, acct.GID); err != nil {
		return Result{}, err
	}
	if err := r.dir(join(o.Root, HelperStateDir), 0o700, 0, 0); err != nil {
		return Result{}, err
	}
	return r, nil
}

// ensureAccount makes the account in the tree, or on the live system.
func ensureAccount(ctx context.Context, root string) (Account, bool, error) {
	if root == "" {
		return ensureAccountLive(ctx)
	}
	return ensureAccountInTree(root)
}

// installBin copies o.Bin to /usr/local/bin/bcd (0755 root) and returns
// its SHA-256, or "" when no binary was given.
func installBin(r *Result, o Options) (string, error) {
	if o.Bin == "" {
		return "", nil
	}
	const maxBin = 256 << 20
	b, err := readRegular(o.Bin, maxBin+1)
	if err != nil {
		return "", fmt.Errorf("--bin: %w", err)
	}
	if len(b) > maxBin {
		return "", fmt.Errorf("--bin %s: over %d bytes", o.Bin, maxBin)
	}
	sum := sha256.Sum256(b)
	if err := r.file(join(o.Root, BinPath), b, 0o755, 0, 0); err != nil {
		return "", err
	}
	return hex.EncodeToString(sum[:]), nil
}

// helperConfig is the helper.toml to write: the existing one's values (an
// operator's join_key_pin stays), the roots given (when any), and the
// installed binary's digest added to the executable pins.
func helperConfig(o Options, exeSum string) (helperconfig.Config, error) {
	path := join(o.Root, ConfigPath)
	cfg := helperconfig.Default()
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if cfg, err = helperconfig.Parse(b); err != nil {
			return cfg, fmt.Errorf("existing %s: %w", path, err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return cfg, fmt.Errorf("read %s: %w", path, err)
	}
	if len(o.CommandRootSHA256) > 0 {
		cfg.CommandRootSHA256 = nil
		for _, p := range o.CommandRootSHA256 {
			if !contains(cfg.CommandRootSHA256, p) {
				cfg.CommandRootSHA256 = append(cfg.CommandRootSHA256, p)
			}
		}
	}
	if exeSum != "" && !contains(cfg.ExeSHA256, exeSum) {
		cfg.ExeSHA256 = append(cfg.ExeSHA256, exeSum)
	}
	// The units name this socket and account, so the file must too.
	cfg.Socket, cfg.NodeUser = HelperSocket, NodeUser
	// Parse lower-cases and validates what the file will hold.
	return helperconfig.Parse(cfg.Encode())
}

// contains reports whether v holds s, case-insensitively for hex.
func contains(v []string, s string) bool {
	for _, x := range v {
		if bytes.EqualFold([]byte(x), []byte(s)) {
			return true
		}
	}
	return false
}

// add records an action.
func (r *Result) add(path, did string) {
	r.Actions = append(r.Actions, Action{Path: path, Did: did})
	if did != DidUnchanged {
		r.Changed = true
	}
}

// didOf names an action from whether it changed something and whether
// the thing existed before.
func didOf(changed, existed bool) string {
	switch {
	case !changed:
		return DidUnchanged
	case existed:
		return DidUpdated
	default:
		return DidCreated
	}
}

// file makes path hold data with mode and owner, and records what it did.
func (r *Result) file(path string, data []byte, mode os.FileMode, uid, gid int) error {
	if err := ensureDir(filepath.Dir(path), 0o755, 0, 0, false); err != nil {
		return err
	}
	existed, same, err := sameFile(path, data, mode, uid, gid)
	if err != nil {
		return err
	}
	if same {
		r.add(path, DidUnchanged)
		return nil
	}
	if err := atomicfile.Write(path, data, mode); err != nil {
		return fmt.Errorf("install: %w", err)
	}
	if err := os.Lchown(path, uid, gid); err != nil {
		return fmt.Errorf("install: %w", err)
	}
	r.add(path, didOf(true, existed))
	return nil
}

// sameFile reports whether path exists, and whether it already is a
// regular file with data, mode and owner.
func sameFile(path string, data []byte, mode os.FileMode, uid, gid int) (existed, same bool, err error) {
	st, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, false, nil
	}
	if err != nil {
		return false, false, fmt.Errorf("install: %w", err)
	}
	if !st.Mode().IsRegular() {
		return true, false, fmt.Errorf("install: %s is not a regular file; remove it first", path)
	}
	old, err := readRegular(path, int64(len(data))+1)
	if err != nil {
		return true, false, err
	}
	return true, bytes.Equal(old, data) && st.Mode().Perm() == mode && owner(st) == [2]int{uid, gid}, nil
}

// dir makes path a directory with mode and owner, and records what it did.
func (r *Result) dir(path string, mode os.FileMode, uid, gid int) error {
	_, err := os.Lstat(path)
	existed := err == nil
	st, err := dirState(path)
	if err != nil {
		return err
	}
	if st != nil && st.Mode().Perm() == mode && owner(st) == [2]int{uid, gid} {
		r.add(path, DidUnchanged)
		return nil
	}
	if err := ensureDir(path, mode, uid, gid, true); err != nil {
		return err
	}
	r.add(path, didOf(true, existed))
	return nil
}

// dirState returns path's Lstat, nil when it does not exist, and an error
// when it is something other than a directory (a symlink included).
func dirState(path string) (os.FileInfo, error) {
	st, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("install: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("install: %s is not a directory (a symlink is refused too)", path)
	}
	return st, nil
}

// ensureDir creates path (and missing parents, 0755 root) when it does
// not exist; with set, it also sets mode and owner on an existing one.
func ensureDir(path string, mode os.FileMode, uid, gid int, set bool) error {
	st, err := dirState(path)
	if err != nil {
		return err
	}
	if st != nil && !set {
		return nil
	}
	if st == nil {
		if err := ensureDir(filepath.Dir(path), 0o755, 0, 0, false); err != nil {
			return err
		}
		if err := os.Mkdir(path, mode); err != nil {
			return fmt.Errorf("install: %w", err)
		}
	}
	if err := os.Lchown(path, uid, gid); err != nil {
		return fmt.Errorf("install: %w", err)
	}
	if err := os.Chmod(path, mode); err != nil { // after Mkdir's umask
		return fmt.Errorf("install: %w", err)
	}
	return nil
}

// owner is a file's uid and gid.
func owner(st os.FileInfo) [2]int {
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return [2]int{int(s.Uid), int(s.Gid)}
	}
	return [2]int{-1, -1}
}

// readRegular reads at most limit bytes of a regular file, not following
// a symlink at path.
func readRegular(path string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("read %s: not a regular file", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, limit))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return b, nil
}

// join puts an absolute installed path under root ("" is "/").
func join(root, p string) string {
	if root == "" {
		return p
	}
	return filepath.Join(root, p)
}
