// Package tmpfs gives tests a real, size-limited filesystem they can fill
// and make read-only, so disk faults are tested against the kernel's own
// ENOSPC and EROFS rather than a fake. Mounting needs root: a test that is
// not root is skipped, unless BC_REQUIRE_ROOT=1 (CI), where it fails.
package tmpfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// Mount mounts a tmpfs of size bytes on a fresh folder under t.TempDir()
// and returns the folder; t.Cleanup unmounts it.
func Mount(t testing.TB, size int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("BC_REQUIRE_ROOT") == "1" {
			t.Fatal("mounting a tmpfs needs root (BC_REQUIRE_ROOT=1)")
		}
		t.Skip("mounting a tmpfs needs root (set BC_REQUIRE_ROOT=1 to require it)")
	}
	dir := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0700", size)); err != nil {
		t.Fatalf("mount tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// ReadOnly remounts the tmpfs at dir read-only (mount -o remount,ro).
func ReadOnly(t testing.TB, dir string) {
	t.Helper()
	if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("remount %s read-only: %v", dir, err)
	}
}

// ReadWrite remounts the tmpfs at dir read-write again.
func ReadWrite(t testing.TB, dir string) {
	t.Helper()
	if err := unix.Mount("", dir, "", unix.MS_REMOUNT, ""); err != nil {
		t.Fatalf("remount %s read-write: %v", dir, err)
	}
}

// Fill writes a file in dir until the filesystem refuses with ENOSPC and
// returns its path; removing it gives the space back.
func Fill(t testing.TB, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill %s: %v", dir, err)
			}
			break
		}
	}
	// Whatever was left below a write's size: one byte at a time.
	for {
		if _, err := f.Write(buf[:1]); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill %s: %v", dir, err)
			}
			return path
		}
	}
}

// Free reports the bytes an unprivileged writer may still use in dir's
// filesystem.
func Free(t testing.TB, dir string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * int64(st.Bsize)
}
