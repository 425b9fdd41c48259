// Package devenv runs `better-compute dev`: the whole system in one process
// on loopback with embedded defaults. SQLite at DATA/control.db, a fresh PKI
// sealed under DATA/kek with three approver keys in DATA/approvers pinned at
// threshold 2, and N simulated nodes that really join with tokens and hold
// mutual-TLS sessions, each with its own state under DATA/nodes/.
// Restarting with the same DATA brings back the same fleet and history.
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

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
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
}

// Env is a running dev system.
type Env struct {
	CP      *server.ControlPlane
	APIURL  string
	KeyFile string
	EnvFile string
	NodeIDs []string
	// SandboxHint says how to use sandboxes (or how to add an image).
	SandboxHint string
	stop        []func()
}

// Start brings the system up and returns once every node is connected.
func Start(ctx context.Context, o Options) (*Env, error) {
	if o.Nodes < 0 || o.Nodes > 1000 {
		return nil, errors.New("--nodes must be between 0 and 1000")
	}
	if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	// The directory holds the key-encryption key: keep it private even when
	// it already existed.
	if err := os.Chmod(o.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	clk := clock.Real{}
	kekPath := filepath.Join(o.DataDir, "kek")
	kek, err := pki.LoadKEK(kekPath)
	if errors.Is(err, os.ErrNotExist) {
		kek, err = pki.CreateKEK(kekPath)
	}
	if err != nil {
		return nil, fmt.Errorf("key-encryption key: %w", err)
	}
	pkiDir := filepath.Join(o.DataDir, "pki")
	b, err := pki.Load(pkiDir)
	if errors.Is(err, os.ErrNotExist) {
		b, err = pki.Init(pkiDir, "dev.bc.local", kek, clk)
	}
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	if b, err = pinDevApprovers(o, pkiDir, b); err != nil {
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
	store, err := imageStore(o.DataDir)
	if err != nil {
		db.Close()
		return nil, err
	}
	runtime := devRuntime()
	cp, err := server.Start(ctx, server.Options{DB: db, Bundle: b, KEK: kek, Clock: clk, Log: o.Log,
		APIListen: o.APIListen, GatewayListen: o.GatewayAddr, SandboxImages: store})
	if err != nil {
		db.Close()
		return nil, err
	}
	e := &Env{CP: cp, APIURL: "http://" + cp.APIAddr, KeyFile: filepath.Join(o.DataDir, "admin.key"), EnvFile: filepath.Join(o.DataDir, "env")}
	e.stop = append(e.stop, func() { cp.Close(); db.Close() })
	fail := func(err error) (*Env, error) { e.Close(); return nil, err }

	if _, err := os.Stat(e.KeyFile); errors.Is(err, os.ErrNotExist) {
		_, key, err := cp.APIKeys.Create(ctx, audit.Entry{TenantID: "root", Actor: "dev"}, "root", "admin", "dev admin", 0)
		if err != nil {
			return fail(err)
		}
		if err := pki.WriteFileAtomic(e.KeyFile, []byte(key+"\n"), 0o600); err != nil {
			return fail(fmt.Errorf("write admin key: %w", err))
		}
	}

	var wg sync.WaitGroup
	up := make(chan string, o.Nodes)
	nctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var mu sync.Mutex
	var agents []*daemon.Node
	e.stop = append([]func(){func() {
		cancel()
		wg.Wait()
		for _, a := range agents {
			_ = a.Close()
		}
	}}, e.stop...)
	for i := 0; i < o.Nodes; i++ {
		name := fmt.Sprintf("sim-%d", i)
		dir := filepath.Join(o.DataDir, "nodes", name)
		if !daemon.Joined(dir) {
			tok, err := cp.Nodes.CreateJoinToken(ctx, audit.Entry{TenantID: "root", Actor: "dev"}, pki.RoleNode, name, 10*time.Minute)
			if err != nil {
				return fail(err)
			}
			if _, err := daemon.Join(ctx, daemon.JoinOptions{DataDir: dir, Gateway: cp.GatewayAddr, Token: tok.Token, Name: name}); err != nil {
				return fail(fmt.Errorf("join %s: %w", name, err))
			}
		}
		drv, closeImages, err := sandboxDriver(nctx, driver.NewSim(name), dir, store, runtime, clk, o.Log)
		if err != nil {
			return fail(fmt.Errorf("sandbox host %s: %w", name, err))
		}
		e.stop = append(e.stop, closeImages)
		a, err := daemon.Open(daemon.Config{DataDir: dir, Gateway: cp.GatewayAddr, Driver: drv, Clock: clk, Log: o.Log,
			Labels: map[string]string{"sim": "true"}})
		if err != nil {
			return fail(fmt.Errorf("open %s: %w", name, err))
		}
		var once sync.Once
		a.OnState(func(c bool) {
			if c {
				once.Do(func() { up <- a.NodeID() })
			}
		})
		mu.Lock()
		agents = append(agents, a)
		mu.Unlock()
		wg.Add(1)
		go func() { defer wg.Done(); _ = a.Run(nctx) }()
	}
	deadline := time.After(60 * time.Second)
	for len(e.NodeIDs) < o.Nodes {
		select {
		case id := <-up:
			e.NodeIDs = append(e.NodeIDs, id)
		case <-deadline:
			return fail(fmt.Errorf("only %d of %d nodes connected within 60s", len(e.NodeIDs), o.Nodes))
		case <-ctx.Done():
			return fail(ctx.Err())
		}
	}
	e.SandboxHint = seedSandboxes(ctx, cp, runtime)
	envText := fmt.Sprintf("export BC_ADDR=%s\nexport BC_API_KEY_FILE=%s\n", shellQuote(e.APIURL), shellQuote(e.KeyFile))
	if err := pki.WriteFileAtomic(e.EnvFile, []byte(envText), 0o600); err != nil {
		return fail(fmt.Errorf("write env file: %w", err))
	}
	return e, nil
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
