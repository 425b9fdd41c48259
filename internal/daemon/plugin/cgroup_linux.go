package plugin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CgroupConfig places plugins in cgroups: Root is where the hierarchies
// are mounted (/sys/fs/cgroup), Parent the directory under each hierarchy
// that holds one child per plugin (created when missing), and MemoryMax
// (bytes) and PidsMax the limits each plugin gets; zero leaves a limit
// unset.
type CgroupConfig struct {
	Root      string
	Parent    string
	MemoryMax int64
	PidsMax   int64
}

// Cgroups is one plugin's cgroups behind one small type: on a cgroup v2
// host one directory (memory.max, pids.max, cgroup.kill); on a v1 or
// hybrid host one directory in each of the pids and memory hierarchies
// (pids.max, memory.limit_in_bytes).
type Cgroups struct {
	v2   bool
	dirs []string // dirs[0] is the one whose cgroup.procs lists the plugin's processes
}

// drainWait bounds how long Kill and Remove wait for killed processes to
// leave the cgroup.
const drainWait = 10 * time.Second

// NewCgroups creates the cgroups of the plugin called name, with cfg's
// limits, before any of its processes exist.
func NewCgroups(cfg CgroupConfig, name string) (*Cgroups, error) {
	if !ValidName(name) || cfg.Parent == "" || strings.Contains(cfg.Parent, "..") {
		return nil, refuse(CodeCgroup, errors.New("invalid cgroup parent or name"))
	}
	cg := &Cgroups{}
	var limits [][2]string
	if _, err := os.Stat(filepath.Join(cfg.Root, "cgroup.controllers")); err == nil {
		cg.v2 = true
		cg.dirs = []string{filepath.Join(cfg.Root, cfg.Parent, name)}
		if err := enableV2(filepath.Join(cfg.Root, cfg.Parent)); err != nil {
			return nil, err
		}
		limits = [][2]string{{"memory.max", itoa(cfg.MemoryMax)}, {"pids.max", itoa(cfg.PidsMax)}}
	} else {
		cg.dirs = []string{filepath.Join(cfg.Root, "pids", cfg.Parent, name), filepath.Join(cfg.Root, "memory", cfg.Parent, name)}
		limits = [][2]string{{"pids.max", itoa(cfg.PidsMax)}, {"memory.limit_in_bytes", itoa(cfg.MemoryMax)}}
	}
	for i, d := range cg.dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			cg.Remove()
			return nil, refuse(CodeCgroup, fmt.Errorf("create cgroup: %w", err))
		}
		for _, l := range limits {
			if l[1] == "" || (!cg.v2 && !strings.HasPrefix(l[0], []string{"pids.", "memory."}[i])) {
				continue
			}
			if err := writeFile(filepath.Join(d, l[0]), l[1]); err != nil {
				cg.Remove()
				return nil, refuse(CodeCgroup, fmt.Errorf("set %s: %w", l[0], err))
			}
		}
	}
	return cg, nil
}

// enableV2 creates parent and enables the memory and pids controllers for
// its children.
func enableV2(parent string) error {
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return refuse(CodeCgroup, fmt.Errorf("create cgroup parent: %w", err))
	}
	if err := writeFile(filepath.Join(parent, "cgroup.subtree_control"), "+memory +pids"); err != nil {
		return refuse(CodeCgroup, fmt.Errorf("enable controllers: %w", err))
	}
	return nil
}

func itoa(n int64) string {
	if n <= 0 {
		return ""
	}
	return strconv.FormatInt(n, 10)
}

func writeFile(path, s string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	_, err = f.WriteString(s)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	return nil
}

// Add moves process pid (all its threads) into every one of the cgroups.
func (c *Cgroups) Add(pid int) error {
	for _, d := range c.dirs {
		if err := writeFile(filepath.Join(d, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
			return refuse(CodeCgroup, fmt.Errorf("add to cgroup: %w", err))
		}
	}
	return nil
}

// Procs returns the pids in the cgroups.
func (c *Cgroups) Procs() ([]int, error) {
	b, err := os.ReadFile(filepath.Join(c.dirs[0], "cgroup.procs"))
	if err != nil {
		return nil, fmt.Errorf("read cgroup.procs: %w", err)
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			pids = append(pids, n)
		}
	}
	return pids, nil
}

// Kill kills every process in the cgroups, including any that left the
// plugin's process group, and waits (up to drainWait) until none is left.
// On v2 it writes cgroup.kill; on v1 it signals each listed pid until the
// list is empty (pids.max bounds how many a fork race can add).
func (c *Cgroups) Kill() error {
	if c.v2 {
		if err := writeFile(filepath.Join(c.dirs[0], "cgroup.kill"), "1"); err != nil {
			return refuse(CodeCgroup, fmt.Errorf("cgroup.kill: %w", err))
		}
	}
	deadline := time.Now().Add(drainWait)
	for {
		pids, err := c.Procs()
		if err != nil || len(pids) == 0 {
			return err
		}
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		if time.Now().After(deadline) {
			return refuse(CodeCgroup, errors.New("processes remain after kill"))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Remove removes the cgroups (they must be empty: call Kill first and
// reap the plugin), waiting up to drainWait for the kernel to release
// them. A cgroup already gone is not an error.
func (c *Cgroups) Remove() error {
	var errs []error
	for _, d := range c.dirs {
		deadline := time.Now().Add(drainWait)
		for {
			err := syscall.Rmdir(d)
			if err == nil || errors.Is(err, syscall.ENOENT) {
				break
			}
			if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("remove cgroup: %w", err))
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return errors.Join(errs...)
}

// Dirs returns the cgroup directories, for tests and diagnostics.
func (c *Cgroups) Dirs() []string { return append([]string(nil), c.dirs...) }
