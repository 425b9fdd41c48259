package action

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"

	"golang.org/x/sys/unix"
)

// original is an effect as the dry run found it in the folder.
type original struct {
	data   []byte
	mode   fs.FileMode
	exists bool
}

// workSlack is the room /work has beyond the originals' sizes.
const workSlack = 64 << 20

// DryRun checks p, fetches its inputs through the egress guard, copies
// the declared effects that exist in folder (regular files only, read
// through os.Root: a link out of the folder is refused) into a fresh
// /work, runs the script in a container with no network, and keeps the
// change list as a plan: every declared effect whose bytes changed or
// that the program created. Nothing is ever deleted, so a deleted effect
// is not a change; an undeclared file the program made is ignored and
// never landed. The plan (its changed bytes, the originals' SHA-256 and
// the input hosts) is stored under StateDir/plans/<id>/.
func (r *Runner) DryRun(ctx context.Context, folder string, p Program) (Plan, error) {
	if err := r.Check(p); err != nil {
		return Plan{}, err
	}
	binary, err := r.binary()
	if err != nil {
		return Plan{}, err
	}
	busybox, err := findBusybox(r.busybox)
	if err != nil {
		return Plan{}, err
	}
	originals, err := readOriginals(folder, p.Effects)
	if err != nil {
		return Plan{}, err
	}
	id := newPlanID()
	d, cleanup, err := r.prepareRun(id, busybox, p, originals)
	defer cleanup()
	if err != nil {
		return Plan{}, err
	}
	hosts, err := r.fetchInputs(ctx, d.inputs, p.Inputs)
	if err != nil {
		return Plan{}, err
	}
	res, err := r.runContainer(ctx, binary, d, "bcact-"+id[len(planIDPrefix):])
	if err != nil {
		return Plan{}, err
	}
	if res.TimedOut {
		res.Stderr += fmt.Sprintf("\n[the program was stopped after %s]\n", r.timeout)
	}
	return r.keepPlan(id, folder, d.work, p.Effects, originals, hosts, res)
}

// readOriginals reads each declared effect that exists in folder.
func readOriginals(folder string, effects []string) (map[string]original, error) {
	root, err := os.OpenRoot(folder)
	if err != nil {
		return nil, fmt.Errorf("action: open folder: %w", err)
	}
	defer root.Close()
	out := make(map[string]original, len(effects))
	for _, e := range effects {
		data, mode, exists, err := readEffect(root, e)
		if err != nil {
			return nil, err
		}
		out[e] = original{data: data, mode: mode, exists: exists}
	}
	return out, nil
}

// prepareRun makes the run's folders under StateDir/run/<id>: the image,
// /work (a tmpfs owned by nobody, holding the originals' copies and the
// effects' parent folders), /inputs and /action (the script). cleanup
// unmounts and removes them; it is safe to call after an error.
func (r *Runner) prepareRun(id, busybox string, p Program, originals map[string]original) (runDirs, func(), error) {
	base := filepath.Join(r.stateDir, "run", id)
	d := runDirs{bundle: base, rootfs: filepath.Join(base, "rootfs"), work: filepath.Join(base, "work"),
		inputs: filepath.Join(base, "inputs"), action: filepath.Join(base, "action")}
	cleanup := func() {
		_ = unix.Unmount(d.work, unix.MNT_DETACH)
		_ = os.RemoveAll(base)
	}
	if err := os.Mkdir(base, 0o700); err != nil {
		return d, cleanup, fmt.Errorf("action: run folder: %w", err)
	}
	for _, dir := range []string{d.work, d.inputs, d.action} {
		if err := os.Mkdir(dir, 0o755); err != nil {
			return d, cleanup, fmt.Errorf("action: run folder: %w", err)
		}
	}
	if err := buildImage(d.rootfs, busybox); err != nil {
		return d, cleanup, err
	}
	if err := os.WriteFile(filepath.Join(d.action, "script.sh"), []byte(p.Script), 0o444); err != nil {
		return d, cleanup, fmt.Errorf("action: script: %w", err)
	}
	size := int64(workSlack)
	for _, o := range originals {
		size += int64(len(o.data))
	}
	opts := fmt.Sprintf("size=%d,mode=0755,uid=%d,gid=%d", size, nobody, nobody)
	if err := unix.Mount("tmpfs", d.work, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return d, cleanup, fmt.Errorf("action: /work: %w", err)
	}
	return d, cleanup, copyOriginals(d.work, originals)
}

// copyOriginals writes each existing original into work and makes every
// effect's parent folders, all owned by nobody.
func copyOriginals(work string, originals map[string]original) error {
	for p, o := range originals {
		parts := []string{}
		for dir := path.Dir(p); dir != "."; dir = path.Dir(dir) {
			parts = append([]string{dir}, parts...)
		}
		for _, dir := range parts {
			full := filepath.Join(work, filepath.FromSlash(dir))
			if err := os.Mkdir(full, 0o755); err != nil && !os.IsExist(err) {
				return fmt.Errorf("action: /work: %w", err)
			}
			if err := os.Lchown(full, nobody, nobody); err != nil {
				return fmt.Errorf("action: /work: %w", err)
			}
		}
		if !o.exists {
			continue
		}
		full := filepath.Join(work, filepath.FromSlash(p))
		if err := os.WriteFile(full, o.data, o.mode|0o600); err != nil {
			return fmt.Errorf("action: /work: %w", err)
		}
		if err := os.Lchown(full, nobody, nobody); err != nil {
			return fmt.Errorf("action: /work: %w", err)
		}
	}
	return nil
}

// keepPlan reads the effects back from work, makes the change list and
// stores the plan.
func (r *Runner) keepPlan(id, folder, work string, effects []string, originals map[string]original, hosts []string, res runResult) (Plan, error) {
	root, err := os.OpenRoot(work)
	if err != nil {
		return Plan{}, fmt.Errorf("action: /work: %w", err)
	}
	defer root.Close()
	sorted := append([]string{}, effects...)
	sort.Strings(sorted)
	sp := storedPlan{Created: r.clock.Now().UTC(), Folder: folder, Hosts: hosts, Originals: map[string]string{}}
	sp.Changes = []Change{}
	var data [][]byte
	for _, e := range sorted {
		b, _, exists, err := readEffect(root, e)
		if err != nil {
			return Plan{}, err
		}
		o := originals[e]
		if !exists || (o.exists && string(b) == string(o.data)) {
			continue // deleted, or unchanged
		}
		c := Change{Path: e, Op: OpCreate, Size: int64(len(b)), SHA256: sha256Hex(b)}
		sp.Originals[e] = ""
		if o.exists {
			c.Op, sp.Originals[e] = OpModify, sha256Hex(o.data)
		}
		sp.Changes = append(sp.Changes, c)
		data = append(data, b)
	}
	sp.Plan = Plan{ID: id, Digest: Digest(sp.Changes), Changes: sp.Changes, ExitCode: res.ExitCode, Stdout: res.Stdout, Stderr: res.Stderr}
	if err := r.savePlan(sp, data); err != nil {
		return Plan{}, err
	}
	r.log.Info("action dry run", "plan", id, "changes", len(sp.Changes), "exit_code", res.ExitCode, "timed_out", res.TimedOut)
	return sp.Plan, nil
}
