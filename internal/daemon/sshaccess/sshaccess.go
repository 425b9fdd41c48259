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
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/crypto/ssh"

	"github.com/bettercompute/bettercompute/internal/atomicfile"
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/sshca"
)

// GenerationFile is the file in StateDir holding the last generation
// applied (decimal).
const GenerationFile = "ssh-access.generation"

// StateFile is the file in StateDir holding the last state applied (its
// payload), from which RevokeSerials rewrites the KRL; FeedFile holds the
// serials the revocation feed revoked ahead of a state (JSON: serial to
// the generation that lists it). Both 0600.
const (
	StateFile = "ssh-access.state"
	FeedFile  = "ssh-access.feed-revoked"
)

// Driver adds ssh.access to another driver.
type Driver struct {
	driver.Driver
	// Dir is where the sshd files go (sshd_config names them: bcd
	// sshd-config prints the lines).
	Dir string
	// StateDir holds GenerationFile (bcd's data folder).
	StateDir string
	// Files, when set, writes the sshd files instead of Dir: the root
	// helper's (bcd helper applies an unprivileged node's signed
	// ssh.access states), by kind and id with hostops' checks.
	Files FileWriter

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
	gen, err := d.apply(ctx, payload)
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
	return d.apply(context.Background(), payload)
}

func (d *Driver) apply(ctx context.Context, payload []byte) (uint64, error) {
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
	ahead, err := d.readAhead()
	if err != nil {
		return 0, err
	}
	ahead = pending(ahead, a)
	if err := d.write(ctx, withAhead(a.Files(ca), ahead)); err != nil {
		return 0, err
	}
	if err := atomicfile.Write(filepath.Join(d.StateDir, StateFile), payload, 0o600); err != nil {
		return 0, fmt.Errorf("sshaccess: record state: %w", err)
	}
	if err := d.writeAhead(ahead); err != nil {
		return 0, err
	}
	if err := atomicfile.Write(filepath.Join(d.StateDir, GenerationFile), []byte(strconv.FormatUint(a.Generation, 10)+"\n"), 0o600); err != nil {
		return 0, fmt.Errorf("sshaccess: record generation: %w", err)
	}
	return a.Generation, nil
}

// RevokeSerials puts serials, which the revocation feed revoked ahead of
// the state of generation that will list them, into the KRL at once: the
// KRL of the state applied is rewritten with them added (its version, the
// applied generation, unchanged: this never applies a state, so the
// generation rule holds). They stay in every KRL written until a state of
// that generation or later is applied (which lists them, or has dropped
// them as expired), so the KRL then equals the control plane's again.
// Serials a state already applied lists, or that generation is already
// applied, change nothing. Without a state applied yet, they are kept for
// the first one (sshd trusts no CA before it).
func (d *Driver) RevokeSerials(generation uint64, serials ...uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	have, err := d.generation()
	if err != nil {
		return err
	}
	ahead, err := d.readAhead()
	if err != nil {
		return err
	}
	a, ca, applied, err := d.applied()
	if err != nil {
		return err
	}
	changed := false
	for _, s := range serials {
		if s == 0 || (generation != 0 && generation <= have) || applied && slices.Contains(a.Revoked, s) {
			continue
		}
		if _, ok := ahead[s]; ok {
			continue
		}
		if len(ahead) >= sshca.MaxAccessRevoked {
			return fmt.Errorf("sshaccess: %d serials revoked ahead of a state already", len(ahead))
		}
		ahead[s] = generation
		changed = true
	}
	if !changed {
		return nil
	}
	if err := d.writeAhead(ahead); err != nil {
		return err
	}
	if !applied {
		return nil
	}
	f := withAhead(a.Files(ca), ahead)
	krl, err := f.KRL.Marshal()
	if err != nil {
		return err
	}
	if d.Files != nil {
		return d.Files.WriteFile(context.Background(), KindKRL, FileDefault, krl)
	}
	return atomicfile.Write(filepath.Join(d.Dir, sshca.KRLFile), krl, sshca.FileMode)
}

// KRLSerials returns the serials of the KRL the driver last wrote: the
// applied state's and those revoked ahead of it.
func (d *Driver) KRLSerials() ([]uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ahead, err := d.readAhead()
	if err != nil {
		return nil, err
	}
	a, ca, applied, err := d.applied()
	if err != nil || !applied {
		return nil, err
	}
	return withAhead(a.Files(ca), ahead).KRL.Serials, nil
}

// pending drops from ahead the serials state a settles: those it lists,
// and those revoked ahead of a generation it reaches.
func pending(ahead map[uint64]uint64, a sshca.Access) map[uint64]uint64 {
	for s, gen := range ahead {
		if slices.Contains(a.Revoked, s) || gen != 0 && gen <= a.Generation {
			delete(ahead, s)
		}
	}
	return ahead
}

// withAhead adds the serials of ahead to f's KRL, in order.
func withAhead(f sshca.Files, ahead map[uint64]uint64) sshca.Files {
	if len(ahead) == 0 {
		return f
	}
	serials := slices.Clone(f.KRL.Serials)
	for s := range ahead {
		if !slices.Contains(serials, s) {
			serials = append(serials, s)
		}
	}
	slices.Sort(serials)
	f.KRL.Serials = serials
	return f
}

// applied reads the last state applied (false: none, or one applied
// before StateFile existed; the next state writes it).
func (d *Driver) applied() (sshca.Access, ssh.PublicKey, bool, error) {
	b, err := os.ReadFile(filepath.Join(d.StateDir, StateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return sshca.Access{}, nil, false, nil
	}
	if err != nil {
		return sshca.Access{}, nil, false, fmt.Errorf("sshaccess: read state: %w", err)
	}
	a, ca, err := sshca.DecodeAccess(b)
	if err != nil {
		return sshca.Access{}, nil, false, fmt.Errorf("sshaccess: stored state: %w", err)
	}
	return a, ca, true, nil
}

func (d *Driver) readAhead() (map[uint64]uint64, error) {
	out := map[uint64]uint64{}
	b, err := os.ReadFile(filepath.Join(d.StateDir, FeedFile))
	if errors.Is(err, fs.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("sshaccess: read feed serials: %w", err)
	}
	var m map[string]uint64
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("sshaccess: feed serials file: %w", err)
	}
	for k, gen := range m {
		s, err := strconv.ParseUint(k, 10, 64)
		if err != nil || s == 0 {
			return nil, fmt.Errorf("sshaccess: feed serials file holds %q", k)
		}
		out[s] = gen
	}
	return out, nil
}

func (d *Driver) writeAhead(ahead map[uint64]uint64) error {
	m := make(map[string]uint64, len(ahead))
	for s, gen := range ahead {
		m[strconv.FormatUint(s, 10)] = gen
	}
	b, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("sshaccess: encode feed serials: %w", err)
	}
	if err := atomicfile.Write(filepath.Join(d.StateDir, FeedFile), b, 0o600); err != nil {
		return fmt.Errorf("sshaccess: record feed serials: %w", err)
	}
	return nil
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

// DialSandbox passes a preview's connection on to the wrapped driver
// (driver.SandboxDialer), or refuses it when that has none.
func (d *Driver) DialSandbox(ctx context.Context, sandboxID string, port uint16) (net.Conn, error) {
	if s, ok := d.Driver.(driver.SandboxDialer); ok {
		return s.DialSandbox(ctx, sandboxID, port)
	}
	return nil, driver.ErrPreviewUnsupported
}

// AdoptSandboxes passes adoption on to the wrapped driver when it hosts
// sandboxes (daemon.SandboxAdopter); without one it adopts none.
func (d *Driver) AdoptSandboxes(ctx context.Context, check func(signed []byte, kind string) ([]byte, error)) ([]string, error) {
	if a, ok := d.Driver.(interface {
		AdoptSandboxes(context.Context, func([]byte, string) ([]byte, error)) ([]string, error)
	}); ok {
		return a.AdoptSandboxes(ctx, check)
	}
	return nil, nil
}

// OpenShell passes an interactive exec on to the wrapped driver
// (driver.Shells), or refuses it when that has none.
func (d *Driver) OpenShell(ctx context.Context, sandboxID string, argv []string) (driver.Shell, error) {
	if s, ok := d.Driver.(driver.Shells); ok {
		return s.OpenShell(ctx, sandboxID, argv)
	}
	return nil, driver.ErrShellUnsupported
}
