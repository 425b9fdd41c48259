package hostinstall

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// dropinDirs are the directories systemd reads a unit's drop-ins from
// (NAME.d) and the type-wide ones (service.d), in the system search path.
func dropinDirs() []string {
	return []string{"/etc/systemd/system.control", "/run/systemd/system.control", "/run/systemd/transient",
		"/etc/systemd/system", "/run/systemd/system", "/usr/local/lib/systemd/system",
		"/usr/lib/systemd/system", "/lib/systemd/system"}
}

// assignment is one Key=Value line of a unit's [Service] section and the
// file it is in.
type assignment struct {
	File, Key, Value string
}

// unitAssignments reads the [Service] lines of a unit and of every
// drop-in that applies to it.
func (d *doctor) unitAssignments(unitPath string) ([]assignment, error) {
	out, err := serviceLines(unitPath)
	if err != nil {
		return nil, err
	}
	name := filepath.Base(unitPath)
	for _, dir := range dropinDirs() {
		for _, sub := range []string{name + ".d", "service.d"} {
			confs, _ := filepath.Glob(filepath.Join(d.path(dir), sub, "*.conf"))
			sort.Strings(confs)
			for _, c := range confs {
				more, err := serviceLines(c)
				if err != nil {
					return nil, err
				}
				out = append(out, more...)
			}
		}
	}
	return out, nil
}

// serviceLines parses one unit file's [Service] section (continuation
// lines joined, comments dropped).
func serviceLines(path string) ([]assignment, error) {
	b, err := readRegular(path, 1<<20)
	if err != nil {
		return nil, err
	}
	var out []assignment
	section, pending := "", ""
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if pending != "" {
			l, pending = pending+" "+l, ""
		}
		if strings.HasSuffix(l, "\\") {
			pending = strings.TrimSuffix(l, "\\")
			continue
		}
		switch {
		case l == "" || l[0] == '#' || l[0] == ';':
		case l[0] == '[':
			section = l
		case section == "[Service]":
			k, v, _ := strings.Cut(l, "=")
			out = append(out, assignment{File: path, Key: strings.TrimSpace(k), Value: strings.TrimSpace(v)})
		}
	}
	return out, sc.Err()
}

// checkUnit checks a unit's file and every drop-in: each required key is
// set, and set to exactly its value wherever it is set; no forbidden key
// is set; no Exec line runs with full privileges ('+' or '!'); and on the
// live system, ExecStart's binary exists.
func (d *doctor) checkUnit(p string, required []requiredLine, forbidden []string) {
	path := d.path(p)
	if _, err := os.Lstat(path); err != nil {
		d.add(FindUnitMissing, path, "%v", err)
		return
	}
	d.rootFile(p, true)
	lines, err := d.unitAssignments(path)
	if err != nil {
		d.add(FindUnitMissing, path, "%v", err)
		return
	}
	for _, r := range required {
		set := false
		for _, a := range lines {
			if a.Key != r.Key {
				continue
			}
			set = true
			if a.Value != r.Value {
				d.add(FindUnitHardening, a.File, "%s=%s, want %s=%s", a.Key, a.Value, r.Key, r.Value)
			}
		}
		if !set {
			d.add(FindUnitHardening, path, "%s=%s is missing", r.Key, r.Value)
		}
	}
	for _, a := range lines {
		for _, f := range forbidden {
			if a.Key == f {
				d.add(FindUnitForbidden, a.File, "%s= is set", a.Key)
			}
		}
		if strings.HasPrefix(a.Key, "Exec") && strings.ContainsAny(execPrefix(a.Value), "+!") {
			d.add(FindUnitForbidden, a.File, "%s runs with full privileges (a '+' or '!' prefix)", a.Key)
		}
		if a.Key == "ExecStart" && d.root == "" {
			d.checkExec(a)
		}
	}
}

// execPrefix is the special-character prefix of an Exec value.
func execPrefix(v string) string {
	i := 0
	for i < len(v) && strings.ContainsRune("@-:+!|", rune(v[i])) {
		i++
	}
	return v[:i]
}

// checkExec reports an ExecStart whose binary does not exist.
func (d *doctor) checkExec(a assignment) {
	v := strings.TrimPrefix(a.Value, execPrefix(a.Value))
	bin, _, _ := strings.Cut(v, " ")
	if bin == "" {
		return // an empty ExecStart= resets the list
	}
	if st, err := os.Stat(bin); err != nil || !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		d.add(FindUnitExec, a.File, "ExecStart's %s is not an executable file", bin)
	}
}
