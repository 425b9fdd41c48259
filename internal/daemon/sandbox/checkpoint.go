package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/bettercompute/bettercompute/internal/sandboxes/checkpoint"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// Layers is a Runtime whose sandboxes' writable layers can be captured:
// where a sandbox's layer (the overlay's upper directory) is on the host,
// and pausing and resuming every process of the sandbox so the layer
// holds still while it is packed.
type Layers interface {
	// LayerDir returns the host directory of sandbox id's writable layer.
	LayerDir(id string) (string, error)
	// Pause freezes every process of the sandbox; Resume thaws them.
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
}

// MemoryCheckpointer is a Runtime that can save a running sandbox's
// processes to a directory and leave it running (runsc).
type MemoryCheckpointer interface {
	// CheckpointMemory saves sandbox id's processes into dir, runs
	// stopped while none of them runs (after the save, before they run
	// again), and restarts the sandbox from what it saved, even when
	// stopped fails.
	CheckpointMemory(ctx context.Context, id, dir string, stopped func() error) error
}

// Reasons a checkpoint or a restore fails with besides the checkpoint
// library's own (checkpoint.Reason*) and spec.ReasonMemoryNeedsRunsc.
const (
	// ReasonCheckpointUnavailable: this host has no checkpoint store, or
	// its runtime cannot capture what was asked.
	ReasonCheckpointUnavailable = "checkpoint-unavailable"
	// ReasonCheckpointFailed: the runtime or the store failed (detail logged).
	ReasonCheckpointFailed = "checkpoint-failed"
)

// reasonError is an error that carries the reason a command fails with
// through a Runtime's Start.
type reasonError struct {
	reason string
	err    error
}

func (e *reasonError) Error() string { return e.reason + ": " + e.err.Error() }
func (e *reasonError) Unwrap() error { return e.err }

// checkpointReason is the reason of a checkpoint library error: its
// refusal reason, checkpoint-not-found, or checkpoint-failed.
func checkpointReason(err error) string {
	if r := checkpoint.ReasonOf(err); r != "" {
		return r
	}
	if errors.Is(err, checkpoint.ErrNotFound) {
		return checkpoint.ErrNotFound.Error()
	}
	return ReasonCheckpointFailed
}

// layerLimits are the bounds of a sandbox's layer checkpoint: the
// library's defaults with overlay whiteouts carried, files bounded by
// the sandbox's disk limit (0: the default), spooled under the host's
// directory.
func (h *Host) layerLimits(diskMB int64) checkpoint.Limits {
	l := checkpoint.DefaultLimits()
	l.Whiteouts, l.SpoolDir = true, h.cfg.Dir
	if diskMB > 0 {
		l.MaxUnpackedBytes = min(l.MaxUnpackedBytes, diskMB<<20)
	}
	return l
}

// Checkpoint runs sandbox.checkpoint: it pauses the sandbox, packs its
// writable layer, resumes it (whatever happened), and stores the archive
// in the host's checkpoint store; with Memory (runsc) it also saves the
// sandbox's processes and stores them as a second archive. The sandbox
// keeps running. It answers spec.CheckpointResult.
func (h *Host) Checkpoint(ctx context.Context, payload []byte) ([]byte, error) {
	var c spec.Checkpoint
	if err := strictJSON(payload, &c); err != nil || c.Validate() != nil {
		return nil, errors.New("payload-invalid")
	}
	p, err := h.programFor(c.SandboxID)
	if err != nil {
		return nil, err
	}
	if h.starting(c.SandboxID) {
		return nil, errors.New("sandbox-not-found")
	}
	if c.Memory && p.rt.Name() != spec.RuntimeRunsc {
		return nil, errors.New(spec.ReasonMemoryNeedsRunsc)
	}
	ly, ok := p.rt.(Layers)
	mc, mok := p.rt.(MemoryCheckpointer)
	if !ok || h.cfg.Checkpoints == nil || (c.Memory && !mok) {
		return nil, errors.New(ReasonCheckpointUnavailable)
	}
	h.ckpt.Lock() // one checkpoint at a time: pause and resume never interleave
	defer h.ckpt.Unlock()
	var res spec.CheckpointResult
	var info, mem checkpoint.Info
	if c.Memory {
		// runsc's memory checkpoint ends the sandbox's instance and
		// restores it from what it saved: the sweep must not take that
		// moment for a death.
		restart := h.restarting(c.SandboxID)
		info, mem, err = h.captureMemory(ctx, ly, mc, c.SandboxID)
		restart()
		res.MemoryDigest, res.MemorySize = mem.Digest, mem.Size
	} else {
		info, err = h.captureLayer(ctx, ly, c.SandboxID, paused(ctx, ly, c.SandboxID))
	}
	if err != nil {
		return nil, err
	}
	res.Digest, res.Size = info.Digest, info.Size
	h.cfg.Log.Info("sandbox checkpointed", "sandbox_id", c.SandboxID, "digest", res.Digest, "size", res.Size, "memory", c.Memory)
	return json.Marshal(res)
}

// restarting marks sandbox id as being started again (the sweep skips
// it, see starting) and returns the function that marks it started.
func (h *Host) restarting(id string) func() {
	h.mu.Lock()
	defer h.mu.Unlock()
	st, ok := h.sbx[id]
	if !ok {
		return func() {}
	}
	st.started = false
	return func() {
		h.mu.Lock()
		st.started = true
		h.mu.Unlock()
	}
}

// paused is the hold of a layer checkpoint without memory: the sandbox
// paused while pack runs, and resumed after whatever happened.
func paused(ctx context.Context, ly Layers, id string) func(pack func() error) error {
	return func(pack func() error) error {
		if err := ly.Pause(ctx, id); err != nil {
			return err
		}
		perr := pack()
		if err := ly.Resume(context.WithoutCancel(ctx), id); err != nil {
			return err
		}
		return perr
	}
}

// captureLayer packs sandbox id's writable layer while hold keeps the
// sandbox still, then stores the archive.
func (h *Host) captureLayer(ctx context.Context, ly Layers, id string, hold func(pack func() error) error) (checkpoint.Info, error) {
	dir, err := ly.LayerDir(id)
	if err != nil {
		h.cfg.Log.Error("sandbox layer not found", "sandbox_id", id, "err", err)
		return checkpoint.Info{}, errors.New(ReasonCheckpointFailed)
	}
	st, _ := h.Get(id)
	f, err := h.spoolFile()
	if err != nil {
		return checkpoint.Info{}, err
	}
	defer f.Close()
	var perr error
	err = hold(func() error {
		_, perr = checkpoint.Pack(ctx, dir, f, h.layerLimits(st.Limits.DiskMB))
		return nil
	})
	if err != nil {
		h.cfg.Log.Error("sandbox not held still for a checkpoint", "sandbox_id", id, "err", err)
		return checkpoint.Info{}, errors.New(ReasonCheckpointFailed)
	}
	if perr != nil {
		h.cfg.Log.Warn("sandbox layer not packed", "sandbox_id", id, "err", perr)
		return checkpoint.Info{}, errors.New(checkpointReason(perr))
	}
	return h.put(ctx, f)
}

// captureMemory saves sandbox id's processes into a fresh directory and
// packs its writable layer while it is stopped between the save and the
// restart (so the two agree exactly), then packs the saved processes;
// it stores both and answers the layer's and the memory's archives.
func (h *Host) captureMemory(ctx context.Context, ly Layers, mc MemoryCheckpointer, id string) (checkpoint.Info, checkpoint.Info, error) {
	var none checkpoint.Info
	dir, err := os.MkdirTemp(h.cfg.Dir, "memory-")
	if err != nil {
		return none, none, fmt.Errorf("sandbox: memory checkpoint: %w", err)
	}
	defer os.RemoveAll(dir)
	layer, err := h.captureLayer(ctx, ly, id, func(pack func() error) error {
		return mc.CheckpointMemory(ctx, id, dir, pack)
	})
	if err != nil {
		return none, none, err
	}
	f, err := h.spoolFile()
	if err != nil {
		return none, none, err
	}
	defer f.Close()
	if _, err := checkpoint.Pack(ctx, dir, f, h.layerLimits(0)); err != nil {
		h.cfg.Log.Warn("sandbox memory not packed", "sandbox_id", id, "err", err)
		return none, none, errors.New(checkpointReason(err))
	}
	mem, err := h.put(ctx, f)
	return layer, mem, err
}

// spoolFile is an unlinked temporary file under the host's directory.
func (h *Host) spoolFile() (*os.File, error) {
	f, err := os.CreateTemp(h.cfg.Dir, "checkpoint-*")
	if err != nil {
		return nil, fmt.Errorf("sandbox: checkpoint spool: %w", err)
	}
	if err := os.Remove(f.Name()); err != nil {
		f.Close()
		return nil, fmt.Errorf("sandbox: checkpoint spool: %w", err)
	}
	return f, nil
}

// put stores the archive in f (written from its start) in the store.
func (h *Host) put(ctx context.Context, f *os.File) (checkpoint.Info, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return checkpoint.Info{}, fmt.Errorf("sandbox: checkpoint spool: %w", err)
	}
	info, err := h.cfg.Checkpoints.Put(ctx, f)
	if err != nil {
		h.cfg.Log.Error("checkpoint not stored", "err", err)
		return checkpoint.Info{}, errors.New(checkpointReason(err))
	}
	return info, nil
}

// restorer returns the Placement.Restore of a create from checkpoint
// digest: it opens the archive in the store, materializes it (verified,
// confined) into the new sandbox's empty layer and gives the tree to the
// sandbox's user. A failure carries the checkpoint's reason.
func (h *Host) restorer(ctx context.Context, c spec.Create) func(upper string, uid, gid int) error {
	return func(upper string, uid, gid int) error {
		if err := h.materialize(ctx, c.FromCheckpoint, upper, h.layerLimits(c.Limits.DiskMB)); err != nil {
			return err
		}
		err := filepath.WalkDir(upper, func(p string, _ os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, uid, gid)
		})
		if err != nil {
			return &reasonError{ReasonCheckpointFailed, fmt.Errorf("sandbox: own restored layer: %w", err)}
		}
		return nil
	}
}

// materialize opens checkpoint digest in the store and materializes it
// into the empty dir under lim.
func (h *Host) materialize(ctx context.Context, digest, dir string, lim checkpoint.Limits) error {
	if h.cfg.Checkpoints == nil {
		return &reasonError{ReasonCheckpointUnavailable, errors.New("no checkpoint store")}
	}
	r, err := h.cfg.Checkpoints.Open(ctx, digest)
	if err != nil {
		return &reasonError{checkpointReason(err), err}
	}
	defer r.Close()
	if err := checkpoint.Materialize(ctx, r, digest, dir, lim); err != nil {
		return &reasonError{checkpointReason(err), err}
	}
	return nil
}

// memoryImage materializes c's memory checkpoint into a fresh directory
// under the host's and returns it; the caller removes it once the
// runtime restored from it.
func (h *Host) memoryImage(ctx context.Context, c spec.Create) (string, error) {
	dir, err := os.MkdirTemp(h.cfg.Dir, "restore-")
	if err != nil {
		return "", &reasonError{ReasonCheckpointFailed, err}
	}
	if err := h.materialize(ctx, c.FromMemory, dir, h.layerLimits(0)); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// startReason is the reason a failed Start fails the create with.
func startReason(err error) error {
	var re *reasonError
	if errors.As(err, &re) {
		return errors.New(re.reason)
	}
	return errors.New("start-failed")
}
