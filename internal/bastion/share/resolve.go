package share

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"strings"
	"syscall"
)

// maxLinks is the most links one path's resolution follows.
const maxLinks = 40

// mode says how resolve treats the path's last component.
type mode int

const (
	// follow: a link at the last component is followed (list, stat, read).
	follow mode = iota
	// noFollow: the last component is the object itself, a link included
	// (a move's source).
	noFollow
	// create: the path may be missing from some component on, and its last
	// component must not exist (a move's destination).
	create
)

// resolved is a path resolved inside the share.
type resolved struct {
	rel  string      // slash path with no link in it ("." for the top)
	info fs.FileInfo // Lstat of rel; nil when missing (create mode)
}

// walk is the state of one resolution.
type walk struct {
	given string   // the path as the caller gave it, for refusals
	done  []string // components resolved so far, none a link
	queue []string // components still to resolve
	hops  int      // links followed
}

// resolve validates given, holds it to the excludes, and resolves it
// component by component inside the root: each component is Lstat'd, and
// a link (except a last one in noFollow and create mode) is replaced by
// its target. Every path the resolution passes through is held to the
// excludes and ".agent" too.
func (f *Folder) resolve(given string, m mode) (resolved, error) {
	rel, err := cleanRel(given)
	if err != nil {
		return resolved{}, err
	}
	if err := f.held(rel, given); err != nil {
		return resolved{}, err
	}
	w := &walk{given: given, queue: splitRel(rel)}
	var info fs.FileInfo
	for len(w.queue) > 0 {
		c := w.queue[0]
		w.queue = w.queue[1:]
		if c == ".." {
			if len(w.done) == 0 {
				return resolved{}, refuse(ReasonLinkOutside, given)
			}
			w.done = w.done[:len(w.done)-1]
			continue
		}
		fi, missing, err := f.step(w, c, m)
		if err != nil || missing {
			return resolved{rel: join(w.done)}, err
		}
		info = fi
	}
	if m == create {
		return resolved{}, refuse(ReasonDestinationExists, given)
	}
	if info == nil { // the top of the share
		if info, err = f.root.Lstat("."); err != nil {
			return resolved{}, fmt.Errorf("share: lstat top: %w", err)
		}
	}
	return resolved{rel: join(w.done), info: info}, nil
}

// step resolves one component c: it holds the path so far to the
// excludes, Lstats it, and follows it if it is a link to follow (pushing
// the target's components onto the queue, fi nil) or appends it to done.
// In create mode a missing component ends the walk (missing true) once
// the rest is checked.
func (f *Folder) step(w *walk, c string, m mode) (fi fs.FileInfo, missing bool, err error) {
	cand := join(append(w.done, c))
	if err := f.held(cand, w.given); err != nil {
		return nil, false, err
	}
	fi, err = f.root.Lstat(cand)
	if errors.Is(err, fs.ErrNotExist) {
		if m != create {
			return nil, false, refuse(ReasonNotFound, w.given)
		}
		w.done = append(w.done, c)
		return nil, true, f.createRest(w)
	}
	if errors.Is(err, syscall.ENOTDIR) {
		return nil, false, refuse(ReasonNotADir, w.given)
	}
	if err != nil {
		return nil, false, fmt.Errorf("share: lstat: %w", err)
	}
	last := len(w.queue) == 0
	if fi.Mode()&fs.ModeSymlink != 0 && (!last || m == follow) {
		return nil, false, f.followLink(w, cand)
	}
	if !last && !fi.IsDir() {
		return nil, false, refuse(ReasonNotADir, w.given)
	}
	w.done = append(w.done, c)
	return fi, false, nil
}

// followLink replaces the link at cand by its target's components.
func (f *Folder) followLink(w *walk, cand string) error {
	w.hops++
	if w.hops > maxLinks {
		return refuse(ReasonLinkLoop, w.given)
	}
	target, err := f.root.Readlink(cand)
	if err != nil {
		return fmt.Errorf("share: readlink: %w", err)
	}
	target = filepath.ToSlash(target)
	if target == "" || strings.HasPrefix(target, "/") || filepath.IsAbs(target) || hasVolume(target) {
		return refuse(ReasonLinkOutside, w.given)
	}
	w.queue = append(splitRel(target), w.queue...)
	return nil
}

// createRest appends the components of a destination that do not exist
// yet, each held to the excludes. A ".." after a missing component
// cannot be resolved (ReasonNotFound).
func (f *Folder) createRest(w *walk) error {
	for _, c := range w.queue {
		if c == ".." {
			return refuse(ReasonNotFound, w.given)
		}
		w.done = append(w.done, c)
		if err := f.held(join(w.done), w.given); err != nil {
			return err
		}
	}
	w.queue = nil
	return nil
}

// held refuses rel if it is in ".agent" or excluded; given is the path
// the caller named, the only one a refusal shows.
func (f *Folder) held(rel, given string) error {
	if inAgent(splitRel(rel)) {
		return refuse(ReasonAgentFolder, given)
	}
	if f.match.Excluded(rel) {
		return refuse(ReasonExcluded, given)
	}
	return nil
}

// join joins components into a slash path, "." for none.
func join(comps []string) string {
	if len(comps) == 0 {
		return "."
	}
	return path.Join(comps...)
}
