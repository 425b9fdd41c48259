// Package devenv runs `better-compute dev`: the whole system in one process
// on loopback with embedded defaults. SQLite at DATA/control.db, a fresh PKI
// sealed under DATA/kek with three approver keys in DATA/approvers pinned at
// threshold 2, and N simulated nodes that really join with tokens and hold
// mutual-TLS sessions, each with its own state under DATA/nodes/. The
// control plane runs the api, gateway, workers and lanes roles; with
// Options.Bastion one local bastion under DATA/bastion forwards a fake
// model server on loopback. Restarting with the same DATA brings back
// the same fleet and history.
package devenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/quorum/approverkeys"
	"github.com/bettercompute/bettercompute/internal/server"
	"github.com/bettercompute/bettercompute/internal/store"
)

// Options configure a dev run.
type Options struct {
	DataDir     string
	Nodes       int
	APIListen   string
	GatewayAddr string
	Log         *slog.Logger
	Out         io.Writer // where the ready message goes
	// Clock is the control plane's and the nodes' clock (default the
	// wall clock).
	Clock clock.Clock
	// TunnelPorts is every simulated node's tunnel allow list (nil: the
	// nodes' default, 22 only).
	TunnelPorts []uint32
	// InstallPackages lets dev install what sandboxes need (busybox-static,
	// runc) with apt-get when they are missing and it runs as root;
	// otherwise it says what to run. Progress shows apt-get's output.
	InstallPackages bool
	Progress        io.Writer
	// Bastion also pairs and runs one local bastion in DATA/bastion that
	// forwards a fake model server on loopback (dev only), granted
	// inference on FakeModelPublic alone: a forward to try end to end.
	Bastion bool
}

// Env is a running dev system.
type Env struct {
	CP      *server.ControlPlane
	APIURL  string
	KeyFile string
	// CAFile is the PEM of the CA the API's certificate chains to.
	CAFile  string
	EnvFile string
	NodeIDs []string
	// SandboxHint says how to use sandboxes (or how to add an image).
	SandboxHint string
	// BastionID is dev's bastion's id (with Options.Bastion; else "").
	BastionID string
	// BastionHint says what to try with the bastion ("" without one).
	BastionHint string
	caPEM       []byte
	stop        []func()
}

// Start brings the system up and returns once every node is connected.
func Start(ctx context.Context, o Options) (*Env, error) {
	if o.Nodes < 0 || o.Nodes > 1000 {
		return nil, errors.New("--nodes must be between 0 and 1000")
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	unlock, err := lockDataDir(o.DataDir)
	if err != nil {
		return nil, err
	}
	e, err := startLocked(ctx, o)
	if err != nil {
		unlock()
		return nil, err
	}
	e.stop = append(e.stop, unlock) // last: the folder is free once all is stopped
	return e, nil
}

// startLocked is Start once the data folder is locked.
func startLocked(ctx context.Context, o Options) (*Env, error) {
	kek, b, err := openPKI(o)
	if err != nil {
		return nil, err
	}
	db, err := store.Open(ctx, "sqlite:"+filepath.Join(o.DataDir, "control.db"))
	if err != nil {
		return nil, err
	}
	if err := db.Migrate(ctx); err != nil {
		db.Close()
		return nil, err
	}
	images, err := imageStore(o.DataDir)
	if err != nil {
		db.Close()
		return nil, err
	}
	cp, err := server.Start(ctx, server.Options{DB: db, Bundle: b, KEK: kek, Clock: o.Clock, Log: o.Log,
		APIListen: o.APIListen, GatewayListen: o.GatewayAddr, SandboxImages: images,
		// The console (/console/) signs in with the session cookie, whose
		// exact Origin is the API's address: known unless picked at start.
		SessionCookies: !strings.HasSuffix(o.APIListen, ":0"), BaseURL: "https://" + o.APIListen,
		Roles: []string{server.RoleAPI, server.RoleGateway, server.RoleWorkers, server.RoleLanes, server.RolePreview}, LanesListen: "127.0.0.1:0", PreviewListen: "127.0.0.1:0"})
	if err != nil {
		db.Close()
		return nil, err
	}
	// The API serves TLS with a certificate from the internal CA, whose PEM
	// DATA/env names in BC_CA_FILE for the CLI.
	e := &Env{CP: cp, APIURL: "https://" + cp.APIAddr, CAFile: filepath.Join(o.DataDir, pki.APICAFile), caPEM: b.APICAPEM(), KeyFile: filepath.Join(o.DataDir, "admin.key"), EnvFile: filepath.Join(o.DataDir, "env")}
	e.stop = append(e.stop, func() { cp.Close(); db.Close() })
	if err := e.bringUp(ctx, o, images); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// bringUp makes the admin key, starts the nodes and waits for them, seeds
// the sandboxes, starts the bastion (with o.Bastion) and writes the env
// file.
func (e *Env) bringUp(ctx context.Context, o Options, images string) error {
	if err := e.adminKey(ctx); err != nil {
		return err
	}
	progress := o.Progress
	if progress == nil {
		progress = io.Discard
	}
	missing := ensurePackages(ctx, o.InstallPackages, progress)
	runtime := devRuntime()
	up, err := e.startNodes(ctx, o, images, runtime)
	if err != nil {
		return err
	}
	if err := e.waitNodes(ctx, o.Nodes, up); err != nil {
		return err
	}
	e.SandboxHint = missing + seedSandboxes(ctx, e.CP, runtime) + previewHint(runtime, e.CP.PreviewAddr)
	if o.Bastion {
		if err := e.startBastion(ctx, o); err != nil {
			return err
		}
	}
	if err := pki.WriteFileAtomic(e.CAFile, e.caPEM, 0o600); err != nil {
		return fmt.Errorf("write API CA: %w", err)
	}
	envText := envFile(e.APIURL, e.KeyFile, e.CAFile, o.DataDir, e.BastionID)
	if err := pki.WriteFileAtomic(e.EnvFile, []byte(envText), 0o600); err != nil {
		return fmt.Errorf("write env file: %w", err)
	}
	return nil
}

// openPKI makes the private data directory and loads (or makes, on the
// first run) its key-encryption key and PKI bundle, with the dev approvers
// pinned.
func openPKI(o Options) (pki.KEK, *pki.Bundle, error) {
	if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
		return pki.KEK{}, nil, fmt.Errorf("data dir: %w", err)
	}
	// The directory holds the key-encryption key: keep it private even when
	// it already existed.
	if err := os.Chmod(o.DataDir, 0o700); err != nil {
		return pki.KEK{}, nil, fmt.Errorf("data dir: %w", err)
	}
	kekPath := filepath.Join(o.DataDir, "kek")
	kek, err := pki.LoadKEK(kekPath)
	if errors.Is(err, os.ErrNotExist) {
		kek, err = pki.CreateKEK(kekPath)
	}
	if err != nil {
		return pki.KEK{}, nil, fmt.Errorf("key-encryption key: %w", err)
	}
	pkiDir := filepath.Join(o.DataDir, "pki")
	b, _, err := pki.EnsureBreakGlassCA(pkiDir, kek) // an older dev folder gets one
	if errors.Is(err, os.ErrNotExist) {
		b, err = pki.Init(pkiDir, "dev.bc.local", kek, o.Clock)
	}
	if err != nil {
		return pki.KEK{}, nil, fmt.Errorf("pki: %w", err)
	}
	if b, err = pinDevApprovers(o, pkiDir, b); err != nil {
		return pki.KEK{}, nil, err
	}
	return kek, b, nil
}

// devActor is the audit actor of what dev does itself, in the root tenant.
var devActor = audit.Entry{TenantID: iam.RootTenant, Actor: "dev"}

// adminKey makes the root tenant's dev admin API key on the first run.
func (e *Env) adminKey(ctx context.Context) error {
	if _, err := os.Stat(e.KeyFile); !errors.Is(err, os.ErrNotExist) {
		return nil
	}
	_, key, err := e.CP.APIKeys.Create(ctx, devActor, iam.RootTenant, "admin", "dev admin", 0)
	if err != nil {
		return err
	}
	if err := pki.WriteFileAtomic(e.KeyFile, []byte(key+"\n"), 0o600); err != nil {
		return fmt.Errorf("write admin key: %w", err)
	}
	return nil
}

// startNodes joins the nodes not joined yet and runs every node's agent
// until Close. The returned channel gets each node's id once its session
// is first up.
func (e *Env) startNodes(ctx context.Context, o Options, images, runtime string) (<-chan string, error) {
	up := make(chan string, o.Nodes)
	nctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	g, gctx := errgroup.WithContext(nctx)
	var agents []*daemon.Node
	e.stop = append([]func(){func() {
		cancel()
		_ = g.Wait()
		for _, a := range agents {
			_ = a.Close()
		}
	}}, e.stop...)
	for i := 0; i < o.Nodes; i++ {
		a, err := e.openNode(ctx, gctx, o, fmt.Sprintf("sim-%d", i), images, runtime)
		if err != nil {
			return nil, err
		}
		var once sync.Once
		a.OnState(func(c bool) {
			if c {
				once.Do(func() { up <- a.NodeID() })
			}
		})
		agents = append(agents, a)
		g.Go(func() error { _ = a.Run(gctx); return nil })
	}
	return up, nil
}

// openNode joins node name when it has not joined yet and opens its agent
// on a sandbox host whose sweep runs on nctx.
func (e *Env) openNode(ctx, nctx context.Context, o Options, name, images, runtime string) (*daemon.Node, error) {
	cp := e.CP
	dir := filepath.Join(o.DataDir, "nodes", name)
	if !daemon.Joined(dir) {
		tok, err := cp.Nodes.CreateJoinToken(ctx, devActor, pki.RoleNode, name, 10*time.Minute)
		if err != nil {
			return nil, err
		}
		if _, err := daemon.Join(ctx, daemon.JoinOptions{DataDir: dir, Gateway: cp.GatewayAddr, Token: tok.Token, Name: name}); err != nil {
			return nil, fmt.Errorf("join %s: %w", name, err)
		}
	}
	drv, closeImages, err := sandboxDriver(nctx, driver.NewSim(name), dir, images, runtime, o.Clock, o.Log)
	if err != nil {
		return nil, fmt.Errorf("sandbox host %s: %w", name, err)
	}
	e.stop = append(e.stop, closeImages)
	a, err := daemon.Open(daemon.Config{DataDir: dir, Gateway: cp.GatewayAddr, Driver: drv, Clock: o.Clock, Log: o.Log,
		Labels: map[string]string{"sim": "true"}, TunnelPorts: o.TunnelPorts})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", name, err)
	}
	return a, nil
}

// connectTimeout bounds how long Start waits for every node's session.
const connectTimeout = 60 * time.Second

// waitNodes records the ids of the n nodes as their sessions come up, or
// fails after connectTimeout.
func (e *Env) waitNodes(ctx context.Context, n int, up <-chan string) error {
	deadline := time.NewTimer(connectTimeout)
	defer deadline.Stop()
	for len(e.NodeIDs) < n {
		select {
		case id := <-up:
			e.NodeIDs = append(e.NodeIDs, id)
		case <-deadline.C:
			return fmt.Errorf("only %d of %d nodes connected within 60s", len(e.NodeIDs), n)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Dev approvers: DATA/approvers/approver-{1,2,3}.key, threshold 2.
const (
	devApprovers         = 3
	devApproverThreshold = 2
)

// pinDevApprovers makes the dev approver keys and pins them into the PKI
// before any node has joined. A data directory whose nodes joined without
// approvers is left as it is: those nodes pinned a bundle with none, so
// they refuse every destructive command (unbatched-destructive without a
// batch) until they join again.
func pinDevApprovers(o Options, pkiDir string, b *pki.Bundle) (*pki.Bundle, error) {
	if len(b.Approvers) > 0 {
		return b, nil
	}
	if _, err := os.Stat(filepath.Join(o.DataDir, "nodes")); err == nil {
		if o.Log != nil {
			o.Log.Warn("no approvers pinned and nodes already joined: destructive commands are refused until the nodes join again", "data", o.DataDir)
		}
		return b, nil
	}
	keys, err := approverkeys.Generate(filepath.Join(o.DataDir, "approvers"), devApprovers)
	if err != nil {
		return nil, fmt.Errorf("approvers: %w", err)
	}
	nb, err := pki.PinApprovers(pkiDir, keys, devApproverThreshold)
	if err != nil {
		return nil, fmt.Errorf("approvers: %w", err)
	}
	return nb, nil
}

// Close stops the nodes and the control plane.
func (e *Env) Close() {
	for _, f := range e.stop {
		f()
	}
	e.stop = nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
