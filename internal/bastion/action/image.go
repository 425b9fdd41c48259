package action

import (
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// busyboxCandidates are where DryRun looks for a static busybox when
// Config.Busybox is empty, in order.
var busyboxCandidates = []string{"/bin/busybox", "/usr/bin/busybox"}

// applets are linked to busybox in the image (an applet this busybox
// lacks answers "applet not found").
var applets = []string{"sh", "ash", "cat", "cp", "mv", "mkdir", "rm", "rmdir", "ls", "ln", "echo", "printf",
	"test", "[", "true", "false", "sed", "awk", "grep", "egrep", "fgrep", "head", "tail", "wc", "sort", "uniq",
	"cut", "tr", "tee", "touch", "date", "sleep", "env", "id", "basename", "dirname", "find", "xargs", "diff",
	"cmp", "md5sum", "sha256sum", "gzip", "gunzip", "zcat", "tar", "base64", "od", "hexdump", "stat", "expr",
	"seq", "wget", "nc", "chmod", "readlink", "realpath", "dd", "ip", "ifconfig", "hostname", "uname", "ps"}

// isStatic reports whether p is an ELF executable with no program
// interpreter (a static binary that runs in an image holding no libc).
func isStatic(p string) bool {
	f, err := elf.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return false
	}
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return false
		}
	}
	return true
}

// findBusybox returns the configured busybox, or the first static one of
// busyboxCandidates; a configured one that is not static is refused.
func findBusybox(configured string) (string, error) {
	if configured != "" {
		if !isStatic(configured) {
			return "", fmt.Errorf("action: %s is not a static executable", configured)
		}
		return configured, nil
	}
	for _, p := range busyboxCandidates {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && isStatic(p) {
			return p, nil
		}
	}
	return "", errors.New("action: no static busybox (install busybox-static)")
}

// buildImage makes a fresh read-only-to-be root filesystem at rootfs:
// /bin/busybox with its applets as links, /etc/passwd and /etc/group
// naming root and nobody, and the mount points of the container.
func buildImage(rootfs, busybox string) error {
	for _, d := range []string{"bin", "etc", "proc", "dev", "sys", "tmp", "work", "inputs", "action"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			return fmt.Errorf("action: image: %w", err)
		}
	}
	if err := copyFile(busybox, filepath.Join(rootfs, "bin", "busybox"), 0o555); err != nil {
		return err
	}
	for _, a := range applets {
		if err := os.Symlink("busybox", filepath.Join(rootfs, "bin", a)); err != nil {
			return fmt.Errorf("action: image: %w", err)
		}
	}
	files := map[string]string{
		"passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/tmp:/bin/sh\n",
		"group":  "root:x:0:\nnobody:x:65534:\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(rootfs, "etc", name), []byte(body), 0o444); err != nil {
			return fmt.Errorf("action: image: %w", err)
		}
	}
	return nil
}

// copyFile copies the regular file src to the new file dst with mode.
func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("action: image: %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("action: image: %w", err)
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("action: image: %w", err)
	}
	return nil
}
