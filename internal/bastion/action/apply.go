package action

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
)

// Apply lands plan planID in folder, once. An id with no plan here (never
// made, expired or spent) is ReasonUnknownPlan; a digest other than the
// plan's is ReasonPlanMismatch and leaves the plan as it was. Past the
// digest the plan is spent, whatever follows: every input host is
// resolved again and every address judged as the package comment says
// (ReasonDestinationPrivate); an effect that changed in folder since the
// dry run is ReasonStale; then each change is written through os.Root of
// folder (temporary file and rename) and nothing else. It returns the
// changes written. folder "" is the folder the dry run ran on; another
// folder than that is ReasonPlanMismatch.
func (r *Runner) Apply(ctx context.Context, folder, planID, digest string) ([]Change, error) {
	r.applyMu.Lock()
	defer r.applyMu.Unlock()
	sp, err := r.loadPlan(planID, r.planDir(planID))
	if err != nil {
		return nil, err
	}
	if subtle.ConstantTimeCompare([]byte(digest), []byte(sp.Digest)) != 1 {
		return nil, refuse(ReasonPlanMismatch, "the digest is not the plan's")
	}
	switch {
	case folder == "":
		folder = sp.Folder
	case folder != sp.Folder:
		return nil, refuse(ReasonPlanMismatch, "the plan was made for another folder")
	}
	// Spend the plan: the one rename that succeeds owns it.
	spent := filepath.Join(r.stateDir, "plans", ".spent-"+planID)
	if err := os.Rename(r.planDir(planID), spent); errors.Is(err, fs.ErrNotExist) {
		return nil, refuse(ReasonUnknownPlan, planID)
	} else if err != nil {
		return nil, fmt.Errorf("action: spend plan: %w", err)
	}
	defer os.RemoveAll(spent)
	changes, err := r.land(ctx, folder, spent, sp)
	if err != nil {
		r.log.Warn("action apply refused", "plan", planID, "err", err)
		return nil, err
	}
	r.log.Info("action applied", "plan", planID, "changes", len(changes))
	return changes, nil
}

// land re-checks the hosts, the originals and the stored bytes of a spent
// plan (its folder is dir), then writes the changes.
func (r *Runner) land(ctx context.Context, folder, dir string, sp storedPlan) ([]Change, error) {
	if Digest(sp.Changes) != sp.Digest {
		return nil, fmt.Errorf("action: plan %s: record does not match its digest", sp.ID)
	}
	for _, h := range sp.Hosts {
		if _, err := r.guard.check(ctx, h); err != nil {
			return nil, err
		}
	}
	root, err := os.OpenRoot(folder)
	if err != nil {
		return nil, fmt.Errorf("action: open folder: %w", err)
	}
	defer root.Close()
	data := make([][]byte, len(sp.Changes))
	for i, c := range sp.Changes {
		if !cleanPath(c.Path) {
			return nil, fmt.Errorf("action: plan %s: a change names a path that is not clean", sp.ID)
		}
		now, err := currentHash(root, c.Path)
		if err != nil {
			return nil, err
		}
		if now != sp.Originals[c.Path] {
			return nil, refuse(ReasonStale, strconv.Quote(c.Path)+" changed since the dry run")
		}
		b, err := os.ReadFile(filepath.Join(dir, "data", strconv.Itoa(i)))
		if err != nil || sha256Hex(b) != c.SHA256 || int64(len(b)) != c.Size {
			return nil, fmt.Errorf("action: plan %s: stored bytes of %s do not match", sp.ID, strconv.Quote(c.Path))
		}
		data[i] = b
	}
	for i, c := range sp.Changes {
		if err := writeEffect(root, c.Path, data[i]); err != nil {
			return nil, err
		}
	}
	return sp.Changes, nil
}
