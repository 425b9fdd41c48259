package driver

import (
	"bufio"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// maxInventoryDisks bounds the disks reported (the gateway refuses more
// than 256).
const maxInventoryDisks = 64

// memTotal returns MemTotal from a /proc/meminfo text, in bytes; 0 when
// the line is missing or malformed.
func memTotal(r io.Reader) int64 {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[0] != "MemTotal:" {
			continue
		}
		v, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil || v < 0 {
			return 0
		}
		if len(f) >= 3 && f[2] == "kB" {
			v *= 1024
		}
		return v
	}
	return 0
}

// statfsFunc returns the size in bytes of the file system mounted at dir.
type statfsFunc func(dir string) (int64, error)

func statfsSize(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Blocks) * int64(st.Bsize), nil
}

// mountedDisks lists the block devices mounted in a /proc/self/mounts
// text: each /dev/ source once (at its first mount point), loop devices
// left out (images, not disks), sized by statfs of the mount point. A
// mount whose statfs fails is skipped. model names a device's model from
// /sys/block when known.
func mountedDisks(r io.Reader, size statfsFunc, model func(dev string) string) []*nodev1.Disk {
	var out []*nodev1.Disk
	seen := map[string]bool{}
	sc := bufio.NewScanner(r)
	for sc.Scan() && len(out) < maxInventoryDisks {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || !strings.HasPrefix(f[0], "/dev/") || seen[f[0]] {
			continue
		}
		dev := strings.TrimPrefix(f[0], "/dev/")
		if strings.HasPrefix(dev, "loop") {
			continue
		}
		b, err := size(unescapeMount(f[1]))
		if err != nil || b <= 0 {
			continue
		}
		seen[f[0]] = true
		out = append(out, &nodev1.Disk{Id: dev, Model: model(dev), SizeBytes: b})
	}
	return out
}

// unescapeMount undoes the octal escapes (\040 for a space) of a mounts
// field.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// sysBlockModel reads /sys/block/DEV/device/model ("" when absent, as for
// a partition or a virtual disk).
func sysBlockModel(dev string) string {
	if strings.ContainsAny(dev, "/.") {
		return ""
	}
	b, err := os.ReadFile(filepath.Join("/sys/block", dev, "device", "model"))
	if err != nil || len(b) > 256 {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// hostMemory is the host's MemTotal in bytes, 0 when unreadable.
func hostMemory() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	return memTotal(f)
}

// hostDisks lists the host's mounted block devices.
func hostDisks() []*nodev1.Disk {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return nil
	}
	defer f.Close()
	return mountedDisks(f, statfsSize, sysBlockModel)
}
