package share

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"
)

// maxMoves is the most moves one plan may hold.
const maxMoves = 100

// archiveRoot is the folder, at the top of the share, that a move with To
// "" goes into, under a folder named for the day.
const archiveRoot = "Archive"

// errExists is renameNoReplace's answer when the destination exists.
var errExists = errors.New("share: destination exists")

// planned is one checked move.
type planned struct {
	move     Move        // as given
	from     string      // resolved source, no link in it
	fromInfo os.FileInfo // Lstat of from
	to       string      // resolved destination; "" when not known yet
	archived bool        // to is in the archive
}

// CheckMoves checks a move plan without moving anything: 1 to 100 moves,
// every path valid and held to the excludes and ".agent" (a folder moved,
// with everything in it), every From existing, every To absent, and no two
// paths the same or one inside another. A move to the archive has its
// destination checked at apply, when the date is known.
func (f *Folder) CheckMoves(moves []Move) error {
	_, err := f.plan(moves, "")
	return err
}

// ApplyMoves checks the plan again, then makes each move in order: a move
// with To "" goes to Archive/<YYYY-MM-DD>/<From> (now's date, in now's
// location). Missing parents are made (0700) inside the folder. Each
// rename never replaces a name (ReasonDestinationExists), so nothing is
// overwritten, and nothing is ever deleted. It returns the moves done (as
// resolved paths; those done before a refusal too) and the archive
// folder's name when a move went there ("" otherwise).
func (f *Folder) ApplyMoves(moves []Move, now time.Time) ([]Move, string, error) {
	archive := archiveRoot + "/" + now.Format(time.DateOnly)
	plan, err := f.plan(moves, archive)
	if err != nil {
		return nil, "", err
	}
	done, used := []Move{}, ""
	for _, p := range plan {
		if err := f.applyOne(p); err != nil {
			return done, used, err
		}
		done = append(done, Move{From: p.from, To: p.to})
		if p.archived {
			used = archive
		}
	}
	return done, used, nil
}

// plan checks every move, and that no two of their paths overlap.
// archive is the archive folder ("" in CheckMoves: not known yet).
func (f *Folder) plan(moves []Move, archive string) ([]planned, error) {
	if len(moves) == 0 || len(moves) > maxMoves {
		return nil, refuse(ReasonPlanInvalid, fmt.Sprintf("%d moves, want 1 to %d", len(moves), maxMoves))
	}
	var out []planned
	var paths []string
	for _, m := range moves {
		p, err := f.checkMove(m, archive)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
		paths = append(paths, p.from)
		if p.to != "" {
			paths = append(paths, p.to)
		}
	}
	for i, a := range paths {
		for _, b := range paths[i+1:] {
			if a == b || strings.HasPrefix(b, a+"/") || strings.HasPrefix(a, b+"/") {
				return nil, refuse(ReasonPlanInvalid, "two moves name "+a+" and "+b)
			}
		}
	}
	return out, nil
}

// checkMove checks one move (see CheckMoves).
func (f *Folder) checkMove(m Move, archive string) (planned, error) {
	from, err := f.resolve(m.From, noFollow)
	if err != nil {
		return planned{}, err
	}
	if from.rel == "." {
		return planned{}, refuse(ReasonPathInvalid, m.From)
	}
	p := planned{move: m, from: from.rel, fromInfo: from.info}
	to := m.To
	if to == "" {
		if archive == "" {
			return p, f.heldTree(p, "")
		}
		to, p.archived = archive+"/"+from.rel, true
	}
	dest, err := f.resolve(to, create)
	if err != nil {
		return planned{}, err
	}
	p.to = dest.rel
	return p, f.heldTree(p, p.to)
}

// heldTree refuses moving p's source, when it is a folder, if any path in
// it, under the source or under to (when known), is excluded or in
// ".agent". Links are not followed (the move moves them, not their
// targets). A folder with more than maxEntries entries in all is refused
// (ReasonTooLarge).
func (f *Folder) heldTree(p planned, to string) error {
	if !p.fromInfo.IsDir() {
		return nil
	}
	from, given := p.from, p.move.From
	dirs, seen := []string{"."}, 0
	for len(dirs) > 0 {
		sub := dirs[len(dirs)-1]
		dirs = dirs[:len(dirs)-1]
		d, err := f.root.OpenFile(path.Join(from, sub), openFlags, 0)
		if err != nil {
			return fmt.Errorf("share: check folder to move: %w", err)
		}
		des, err := d.ReadDir(maxEntries + 1 - seen)
		d.Close()
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("share: check folder to move: %w", err)
		}
		if seen += len(des); seen > maxEntries {
			return refuse(ReasonTooLarge, given)
		}
		for _, de := range des {
			rel := path.Join(sub, de.Name())
			if err := f.heldBoth(from, to, rel, given); err != nil {
				return err
			}
			if de.IsDir() {
				dirs = append(dirs, rel)
			}
		}
	}
	return nil
}

// heldBoth holds rel under from, and under to when known.
func (f *Folder) heldBoth(from, to, rel, given string) error {
	if err := f.held(path.Join(from, rel), given); err != nil {
		return err
	}
	if to == "" {
		return nil
	}
	return f.held(path.Join(to, rel), given)
}

// applyOne makes one checked move: it makes the destination's parents,
// checks the source and destination again, opens both parents through
// the root (each the folder resolved), and renames without replacing.
func (f *Folder) applyOne(p planned) error {
	if err := f.root.MkdirAll(path.Dir(p.to), 0o700); err != nil {
		return fmt.Errorf("share: make destination folder: %w", err)
	}
	src, err := f.resolve(p.from, noFollow)
	if err != nil {
		return err
	}
	if src.rel != p.from || !os.SameFile(src.info, p.fromInfo) {
		return refuse(ReasonPathChanged, p.move.From)
	}
	dest, err := f.resolve(p.to, create)
	if err != nil {
		return err
	}
	if dest.rel != p.to {
		return refuse(ReasonPathChanged, p.to)
	}
	fromDir, err := f.openDir(path.Dir(p.from), p.move.From)
	if err != nil {
		return err
	}
	defer fromDir.Close()
	toDir, err := f.openDir(path.Dir(p.to), p.to)
	if err != nil {
		return err
	}
	defer toDir.Close()
	if f.beforeRename != nil {
		f.beforeRename(p.move)
	}
	err = renameNoReplace(fromDir, path.Base(p.from), toDir, path.Base(p.to))
	if errors.Is(err, errExists) {
		return refuse(ReasonDestinationExists, p.to)
	}
	if err != nil {
		return fmt.Errorf("share: move: %w", err)
	}
	return nil
}

// openDir resolves the folder rel (a path with no link) and opens it
// through the root, requiring the folder opened to be the one resolved.
func (f *Folder) openDir(rel, given string) (*os.File, error) {
	r, err := f.resolve(rel, follow)
	if err != nil {
		return nil, err
	}
	if r.rel != rel || !r.info.IsDir() {
		return nil, refuse(ReasonPathChanged, given)
	}
	return f.openSame(r, given)
}

// CheckEffect holds rel, a file an action op may change, to the share's
// rules whether or not it exists yet: the path as named and wherever a
// link in it leads is neither excluded nor in ".agent", and no link
// leaves the folder; the components of a missing tail are held one by one.
func (f *Folder) CheckEffect(rel string) error {
	_, err := f.resolve(rel, follow)
	var re *RefusedError
	if errors.As(err, &re) && re.Reason == ReasonNotFound {
		_, err = f.resolve(rel, create)
	}
	return err
}
