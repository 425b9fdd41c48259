// Package sshaccess is bcd's side of break-glass SSH: a driver that runs
// the ssh.access command by decoding its payload strictly (sshca.Access)
// and writing the sshd files (sshca.WriteSSHDFiles) into one directory,
// refusing a state older than the one it applied, so that two queued
// states never let the older overwrite the newer.
package sshaccess

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/bettercompute/bettercompute/internal/atomicfile"
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/sshca"
)

// GenerationFile is the file in StateDir holding the last generation
// applied (decimal).
const GenerationFile = "ssh-access.generation"

// Driver adds ssh.access to another driver.
type Driver struct {
	driver.Driver
	// Dir is where the sshd files go (sshd_config names them: bcd
	// sshd-config prints the lines).
	Dir string
	// StateDir holds GenerationFile (bcd's data folder).
	StateDir string

	mu     sync.Mutex
	nodeID string
}

// SetNodeID sets the node this driver writes principals for; bcd sets it
// once the node's identity is open, before any command runs. Until then
// ssh.access is refused.
func (d *Driver) SetNodeID(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.nodeID = id
}

// Run runs ssh.access, and every other kind on the wrapped driver.
func (d *Driver) Run(ctx context.Context, kind string, payload []byte) ([]byte, error) {
	if kind != kinds.SSHAccess {
		return d.Driver.Run(ctx, kind, payload)
	}
	gen, err := d.Apply(payload)
	var coded *errs.Error
	if errors.As(err, &coded) {
		return nil, errors.New(coded.Message) // the reason the control plane sees: "<reason>: <detail>"
	}
	if err != nil {
		return nil, err
	}
	return json.Marshal(map[string]uint64{"generation": gen})
}

// Apply decodes payload strictly and writes its sshd files, unless it is
// for another node (sshca.ReasonAccessOtherNode) or older than the
// generation already applied (sshca.ReasonAccessStale); the same
// generation again is written again (a retried command). The generation
// is recorded after the files, so a crash between them makes the next
// apply of that generation write them again.
func (d *Driver) Apply(payload []byte) (uint64, error) {
	a, ca, err := sshca.DecodeAccess(payload)
	if err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.nodeID == "" || a.NodeID != d.nodeID {
		return 0, errs.New(errs.AccessDenied, sshca.ReasonAccessOtherNode+": the state is for another node")
	}
	have, err := d.generation()
	if err != nil {
		return 0, err
	}
	if a.Generation < have {
		return 0, errs.New(errs.InvalidState, fmt.Sprintf("%s: generation %d is older than the applied %d", sshca.ReasonAccessStale, a.Generation, have))
	}
	if err := sshca.WriteSSHDFiles(d.Dir, a.Files(ca)); err != nil {
		return 0, err
	}
	if err := atomicfile.Write(filepath.Join(d.StateDir, GenerationFile), []byte(strconv.FormatUint(a.Generation, 10)+"\n"), 0o600); err != nil {
		return 0, fmt.Errorf("sshaccess: record generation: %w", err)
	}
	return a.Generation, nil
}

// Generation returns the last generation applied (0: none).
func (d *Driver) Generation() (uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.generation()
}

func (d *Driver) generation() (uint64, error) {
	b, err := os.ReadFile(filepath.Join(d.StateDir, GenerationFile))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("sshaccess: read generation: %w", err)
	}
	g, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("sshaccess: generation file is not a number: %w", err)
	}
	return g, nil
}

// Labels passes on the wrapped driver's capability labels (the sandbox
// host's runtime labels, daemon.Labeler), so that wrapping it hides none.
func (d *Driver) Labels() map[string]string {
	if l, ok := d.Driver.(interface{ Labels() map[string]string }); ok {
		return l.Labels()
	}
	return nil
}

// OnSandboxFailed passes f on to the wrapped driver when it reports dead
// sandboxes (daemon.SandboxFailures).
func (d *Driver) OnSandboxFailed(f func(sandboxID, reason string)) {
	if s, ok := d.Driver.(interface {
		OnSandboxFailed(func(sandboxID, reason string))
	}); ok {
		s.OnSandboxFailed(f)
	}
}

// OpenShell passes an interactive exec on to the wrapped driver
// (driver.Shells), or refuses it when that has none.
func (d *Driver) OpenShell(ctx context.Context, sandboxID string, argv []string) (driver.Shell, error) {
	if s, ok := d.Driver.(driver.Shells); ok {
		return s.OpenShell(ctx, sandboxID, argv)
	}
	return nil, driver.ErrShellUnsupported
}
