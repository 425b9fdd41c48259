// Package imagetar builds sandbox images: a deterministic tar of a root
// filesystem (sorted entries, zero times and owners unless kept, no
// devices), whose SHA-256 is the image's digest, and the small default
// image dev imports, made from the host's static busybox.
package imagetar

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Digest returns "sha256:<hex>" of b.
func Digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// FromDir writes a deterministic tar of dir to w: entries in path order,
// times zeroed, owners root unless the file is owned by nobody, device
// nodes and sockets refused.
func FromDir(dir string, w io.Writer) error {
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			paths = append(paths, p)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("imagetar: walk: %w", err)
	}
	sort.Strings(paths)
	tw := tar.NewWriter(w)
	for _, p := range paths {
		rel, _ := filepath.Rel(dir, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return fmt.Errorf("imagetar: %w", err)
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return fmt.Errorf("imagetar: %w", err)
			}
		}
		switch {
		case fi.Mode().IsRegular(), fi.IsDir(), fi.Mode()&fs.ModeSymlink != 0:
		default:
			return fmt.Errorf("imagetar: %s: only files, directories and symbolic links go into an image", rel)
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return fmt.Errorf("imagetar: %w", err)
		}
		h.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			h.Name += "/"
		}
		h.ModTime, h.AccessTime, h.ChangeTime = time.Unix(0, 0), time.Time{}, time.Time{}
		h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
		h.Format = tar.FormatPAX
		h.PAXRecords = nil
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("imagetar: %w", err)
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return fmt.Errorf("imagetar: %w", err)
			}
			_, err = io.Copy(tw, f)
			f.Close()
			if err != nil {
				return fmt.Errorf("imagetar: %w", err)
			}
		}
	}
	return tw.Close()
}

// rootHome is the image's /root, the home directory of its uid 0 (a
// path, not a tenant).
const rootHome = "root" // archtest:not-tenant

// BusyboxPath returns the host's static busybox, or an error saying how
// to get one.
func BusyboxPath() (string, error) {
	for _, p := range []string{"/usr/bin/busybox", "/bin/busybox"} {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			if isStatic(p) {
				return p, nil
			}
		}
	}
	return "", errors.New("no static busybox on this host: install it (apt-get install busybox-static) or import an image with `better-compute images import NAME --rootfs DIR`")
}

// isStatic reports whether the ELF file at p has no program interpreter.
func isStatic(p string) bool {
	b, err := os.ReadFile(p)
	if err != nil {
		return false
	}
	return !bytes.Contains(b[:min(len(b), 4096)], []byte("/lib64/ld-linux")) && !bytes.Contains(b[:min(len(b), 4096)], []byte("/lib/ld-"))
}

// applets are linked to busybox in the default image (when `busybox
// --list` cannot be read).
var applets = []string{"sh", "ls", "cat", "echo", "env", "id", "hostname", "sleep", "nc", "wget", "ps", "true", "false",
	"mkdir", "rm", "touch", "head", "tail", "grep", "sed", "wc", "uname", "dd", "ln", "cp", "mv", "chmod", "date"}

// Busybox builds the default image: /bin/busybox (static) and its
// applets as symbolic links, /tmp (1777), /etc/passwd and /etc/group
// naming root and nobody, /home/nobody owned by nothing special.
func Busybox() ([]byte, error) {
	bb, err := BusyboxPath()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "bc-busybox-")
	if err != nil {
		return nil, fmt.Errorf("imagetar: %w", err)
	}
	defer os.RemoveAll(dir)
	for _, d := range []string{"bin", "etc", "tmp", rootHome, "proc", "sys", "dev", "home", "usr/bin"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("imagetar: %w", err)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "tmp"), fs.ModeSticky|0o777); err != nil {
		return nil, fmt.Errorf("imagetar: %w", err)
	}
	src, err := os.ReadFile(bb)
	if err != nil {
		return nil, fmt.Errorf("imagetar: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "busybox"), src, 0o755); err != nil {
		return nil, fmt.Errorf("imagetar: %w", err)
	}
	list := applets
	if out, err := exec.Command(bb, "--list").Output(); err == nil {
		list = strings.Fields(string(out))
	}
	for _, a := range list {
		if a == "busybox" || strings.ContainsAny(a, "/.") {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", a)); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("imagetar: %w", err)
		}
	}
	files := map[string]string{
		"etc/passwd":   "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/tmp:/bin/sh\n",
		"etc/group":    "root:x:0:\nnogroup:x:65534:\n",
		"etc/hostname": "sandbox\n",
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			return nil, fmt.Errorf("imagetar: %w", err)
		}
	}
	var buf bytes.Buffer
	if err := FromDir(dir, &buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
