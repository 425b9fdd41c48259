package driver

import (
	"errors"
	"strings"
	"testing"
)

// TestLinuxInventoryOnThisHost: the linux driver reports this machine's
// memory and at least one mounted disk with a size (it once reported
// memory_bytes 0 and no disks on a 24 GiB machine).
func TestLinuxInventoryOnThisHost(t *testing.T) {
	inv := NewLinux().Inventory()
	if inv.MemoryBytes <= 0 {
		t.Fatalf("memory_bytes = %d, want > 0", inv.MemoryBytes)
	}
	if len(inv.Disks) == 0 {
		t.Fatal("no disks reported")
	}
	for _, d := range inv.Disks {
		if d.Id == "" || d.SizeBytes <= 0 {
			t.Fatalf("disk %+v: want an id and a size", d)
		}
	}
}

func TestMemTotal(t *testing.T) {
	for in, want := range map[string]int64{
		"MemTotal:       24683656 kB\nMemFree: 1 kB\n": 24683656 * 1024,
		"MemFree: 1 kB\n":  0,
		"MemTotal: x kB\n": 0,
		"":                 0,
	} {
		if got := memTotal(strings.NewReader(in)); got != want {
			t.Errorf("memTotal(%q) = %d, want %d", in, got, want)
		}
	}
}

func TestMountedDisks(t *testing.T) {
	mounts := `proc /proc proc rw 0 0
/dev/vda / ext4 rw 0 0
/dev/vda /run/netns ext4 rw 0 0
/dev/loop0 /snap/x squashfs ro 0 0
/dev/sdb1 /mnt/my\040data xfs rw 0 0
/dev/sdc /broken ext4 rw 0 0
tmpfs /tmp tmpfs rw 0 0
`
	var asked []string
	size := func(dir string) (int64, error) {
		asked = append(asked, dir)
		if dir == "/broken" {
			return 0, errors.New("gone")
		}
		return 1 << 30, nil
	}
	ds := mountedDisks(strings.NewReader(mounts), size, func(dev string) string { return "m-" + dev })
	if len(ds) != 2 || ds[0].Id != "vda" || ds[1].Id != "sdb1" || ds[0].Model != "m-vda" || ds[1].SizeBytes != 1<<30 {
		t.Fatalf("disks = %v", ds)
	}
	if strings.Join(asked, ",") != "/,/mnt/my data,/broken" {
		t.Fatalf("statfs asked %q", asked)
	}
}
