package agent

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/bettercompute/bettercompute/internal/bastion/action"
	"github.com/bettercompute/bettercompute/internal/bastion/approval"
	"github.com/bettercompute/bettercompute/internal/bastion/ops"
	"github.com/bettercompute/bettercompute/internal/bastion/share"
	"github.com/bettercompute/bettercompute/internal/bastion/terminal"
	"github.com/bettercompute/bettercompute/internal/bastion/wgtun"
	"github.com/bettercompute/bettercompute/internal/clock"
)

// PortOps is the op server's tunnel port (internal/bastion/ops).
const PortOps = ops.PortOps

// actionsDir holds the action ops' dry-run plans, under the data folder.
const actionsDir = "actions"

// OpenApprovals opens the approval store of a paired bastion's data
// folder: the second factor, approvals, standing grants, the root
// command grant and the anchor. Its seals are keyed from the bastion's
// own WireGuard key, so they die with the pairing. The bcd commands
// run on the machine (enroll, approve, ops, root-grant, anchor) open
// it as the running bastion does; the store locks its files.
func OpenApprovals(dir string, clk clock.Clock) (*approval.Store, error) {
	// The folder holds the bastion's keys: only its owner may enter it
	// (a folder made before, by hand or by a test, is tightened).
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("bastion: data folder: %w", err)
	}
	key, err := readWGKey(dir)
	if err != nil {
		return nil, err
	}
	id, err := PairedID(dir)
	if err != nil {
		return nil, err
	}
	if clk == nil {
		clk = clock.Real{}
	}
	return approval.OpenStore(approval.Config{Dir: dir, Secret: key[:], BastionID: id, Clock: clk})
}

// PairedID is the bastion id a paired data folder was paired as.
func PairedID(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, pairedFile))
	if err != nil {
		return "", fmt.Errorf("bastion: %s is not a paired bastion's folder (run bcd bastion pair): %w", dir, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// openOps builds the op server the tunnel serves on PortOps.
func (a *Agent) openOps() error {
	st, err := OpenApprovals(a.cfg.DataDir, a.cfg.Clock)
	if err != nil {
		return err
	}
	runner, err := action.New(action.Config{StateDir: filepath.Join(a.cfg.DataDir, actionsDir), Runtime: a.cfg.ActionRuntime,
		Anchored: st.Anchored, Resolver: a.cfg.Resolver, Local: a.cfg.Local, Clock: a.cfg.Clock, Log: a.cfg.Log})
	if err != nil {
		return err
	}
	terms, err := terminal.New(terminal.Config{Dir: a.cfg.DataDir, Shell: a.cfg.Shell, Clock: a.cfg.Clock, Log: a.cfg.Log,
		Audit: func(kind, reason, detail string) { a.record(kind, "terminal", reason, "", detail) }, IsRoot: a.cfg.IsRoot})
	if err != nil {
		return err
	}
	files := shareFiles{dir: a.cfg.DataDir, clk: a.cfg.Clock}
	srv, err := ops.New(ops.Config{Approvals: approvals{st}, Files: files, Actions: &actions{r: runner, dir: a.cfg.DataDir},
		Root: rootRunner{t: terms, st: st}, Terminals: terms, Dialer: a.cfg.Egress, Shares: files.paths, IsRoot: a.cfg.IsRoot,
		Clock: a.cfg.Clock, Log: a.cfg.Log, Audit: func(kind, reason, detail string) { a.record(kind, "ops", reason, "", detail) }})
	if err != nil {
		return err
	}
	a.approvals, a.ops = st, srv
	return nil
}

// startOps serves the op server inside the tunnel, to the host only.
func (a *Agent) startOps(ctx context.Context, tun *wgtun.Tunnel, host netip.Addr, wg *sync.WaitGroup) error {
	ln, err := tun.ListenTCP(PortOps)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: a.ops.Handler(), ReadHeaderTimeout: 10 * time.Second,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	wg.Add(2)
	go func() {
		defer wg.Done()
		_ = srv.Serve(&gatedListener{Listener: ln, host: host, lane: "ops", a: a})
	}()
	go func() {
		defer wg.Done()
		<-ctx.Done()
		srv.Close()
	}()
	return nil
}

// approvals is the op server's view of the approval store.
type approvals struct{ st *approval.Store }

func (p approvals) Enrolled() bool                      { return p.st.Enrolled() }
func (p approvals) Spend(id, kind, digest string) error { return p.st.Spend(id, kind, digest) }
func (p approvals) WritesLocked() (time.Time, bool)     { return p.st.WritesLocked() }
func (p approvals) NoteRefusedWrite()                   { p.st.NoteRefusedWrite() }
func (p approvals) Anchored() bool                      { return p.st.Anchored() }

func (p approvals) Ask(kind, digest, summary string) (string, time.Time, error) {
	r, err := p.st.Ask(kind, digest, summary)
	return r.ID, r.Expires, err
}

func (p approvals) UseStanding(kind string) error {
	_, err := p.st.UseStanding(kind)
	return err
}

// shareFiles runs the file ops in the folders shared from this machine.
type shareFiles struct {
	dir string
	clk clock.Clock
}

// paths lists the shared folders (observe:disk reports them).
func (f shareFiles) paths() []string {
	ss, _ := share.List(f.dir)
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.Path
	}
	return out
}

// folder opens the share id and runs fn in it.
func (f shareFiles) folder(id string, fn func(*share.Folder) (any, error)) (any, error) {
	s, err := share.Find(f.dir, id)
	if err != nil {
		return nil, err
	}
	fo, err := share.OpenFolder(s)
	if err != nil {
		return nil, err
	}
	defer fo.Close()
	return fn(fo)
}

func (f shareFiles) List(id, rel string) (any, error) {
	return f.folder(id, func(fo *share.Folder) (any, error) {
		es, err := fo.List(rel)
		if es == nil {
			es = []share.Entry{}
		}
		return es, err
	})
}

func (f shareFiles) Stat(id, rel string) (any, error) {
	return f.folder(id, func(fo *share.Folder) (any, error) {
		return fo.Stat(rel)
	})
}

func (f shareFiles) Read(id, rel string) ([]byte, error) {
	b, err := f.folder(id, func(fo *share.Folder) (any, error) { return fo.Read(rel, share.MaxRead) })
	if err != nil {
		return nil, err
	}
	return b.([]byte), nil
}

func (f shareFiles) CheckMoves(id string, moves []ops.Move) error {
	_, err := f.folder(id, func(fo *share.Folder) (any, error) { return nil, fo.CheckMoves(toShareMoves(moves)) })
	return err
}

func (f shareFiles) ApplyMoves(id string, moves []ops.Move) (any, error) {
	return f.folder(id, func(fo *share.Folder) (any, error) {
		done, archive, err := fo.ApplyMoves(toShareMoves(moves), f.clk.Now())
		return map[string]any{"moved": done, "archive": archive}, err
	})
}

// toShareMoves converts the op's moves.
func toShareMoves(ms []ops.Move) []share.Move {
	out := make([]share.Move, len(ms))
	for i, m := range ms {
		out[i] = share.Move{From: m.From, To: m.To}
	}
	return out
}

// actions runs action ops in shared folders.
type actions struct {
	r   *action.Runner
	dir string
}

// program is the action package's view of the op's arguments.
func program(a ops.DryRunArgs) action.Program {
	p := action.Program{Script: a.Script, Effects: a.Effects}
	for _, in := range a.Inputs {
		p.Inputs = append(p.Inputs, action.Input{URL: in.URL, As: in.As})
	}
	return p
}

// heldEffects holds every path to share s's excludes and ".agent" (the
// path as named and wherever a link in it leads), as the file ops are.
func heldEffects(s share.Share, paths []string) error {
	fo, err := share.OpenFolder(s)
	if err != nil {
		return err
	}
	defer fo.Close()
	for _, p := range paths {
		if err := fo.CheckEffect(p); err != nil {
			return err
		}
	}
	return nil
}

// checked finds the share a dry run names and holds its effects to it.
func (x *actions) checked(id string, a ops.DryRunArgs) (share.Share, error) {
	s, err := share.Find(x.dir, id)
	if err != nil {
		return s, err
	}
	if err := heldEffects(s, a.Effects); err != nil {
		return s, err
	}
	return s, x.r.Check(program(a))
}

func (x *actions) Check(id string, a ops.DryRunArgs) error {
	_, err := x.checked(id, a)
	return err
}

func (x *actions) DryRun(ctx context.Context, a ops.DryRunArgs) (any, error) {
	s, err := x.checked(a.Share, a)
	if err != nil {
		return nil, err
	}
	return x.r.DryRun(ctx, s.Path, program(a))
}

// applicable checks, before the person is asked and again at apply, that
// plan's digest is digest and that its folder is still shared, with every
// path it writes held to the share's excludes as they are now.
func (x *actions) applicable(plan, digest string) error {
	pi, err := x.r.Info(plan)
	if err != nil {
		return err
	}
	if pi.Digest != digest {
		return &action.RefusedError{Reason: action.ReasonPlanMismatch, Detail: "the digest is not the plan's"}
	}
	ss, err := share.List(x.dir)
	if err != nil {
		return err
	}
	for _, s := range ss {
		if s.Path == pi.Folder {
			return heldEffects(s, pi.Paths)
		}
	}
	return &share.RefusedError{Reason: share.ReasonUnknownShare, Detail: "the plan's folder is no longer shared"}
}

func (x *actions) PlanSummary(plan, digest string) (string, error) {
	if err := x.applicable(plan, digest); err != nil {
		return "", err
	}
	return x.r.Summary(plan)
}

func (x *actions) Apply(ctx context.Context, a ops.ApplyArgs) (any, error) {
	if err := x.applicable(a.Plan, a.Digest); err != nil {
		return nil, err
	}
	return x.r.Apply(ctx, "", a.Plan, a.Digest)
}

// rootRunner runs root commands under the root command grant given on
// this machine with a code.
type rootRunner struct {
	t  *terminal.Terminals
	st *approval.Store
}

func (r rootRunner) Run(ctx context.Context, argv []string) (any, error) {
	return r.t.RunRoot(ctx, argv, r.st.RootGrant)
}
