package action

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/netguard"
)

// The OCI runtimes a Runner drives.
const (
	// RuntimeRunc is runc (the default).
	RuntimeRunc = "runc"
	// RuntimeRunsc is gVisor's runsc, on its ptrace platform with no
	// network.
	RuntimeRunsc = "runsc"
)

// DefaultTimeout bounds one dry run's program.
const DefaultTimeout = 60 * time.Second

// Config configures a Runner.
type Config struct {
	// StateDir keeps the plans (DIR/plans/<id>/, folders 0700, files
	// 0600) and the runtime's state; it is made 0700.
	StateDir string
	// Runtime is RuntimeRunc ("" too) or RuntimeRunsc.
	Runtime string
	// RuntimeBinary is the runtime's path; "" looks Runtime up in PATH.
	RuntimeBinary string
	// Busybox is a static busybox for the image; "" takes the first
	// static one of /bin/busybox and /usr/bin/busybox.
	Busybox string
	// Anchored reports whether a fleet anchored this machine: anchored
	// machines keep private destinations (never loopback, link-local,
	// metadata or this machine). nil means unanchored.
	Anchored func() bool
	// Resolver resolves input hosts; nil means net.DefaultResolver.
	Resolver netguard.Resolver
	// Local tells this machine's addresses; nil means
	// netguard.NewLocalChecker().
	Local netguard.LocalChecker
	// Clock dates plans; nil means the wall clock.
	Clock clock.Clock
	// Log gets one line per dry run and apply; nil discards.
	Log *slog.Logger
	// Timeout bounds each dry run's program; 0 means DefaultTimeout.
	Timeout time.Duration
}

// Runner runs action ops' dry runs and applies. It is safe for
// concurrent use.
type Runner struct {
	stateDir, runtime, runtimeBinary, busybox string
	guard                                     *guard
	clock                                     clock.Clock
	log                                       *slog.Logger
	timeout                                   time.Duration
	// applyMu makes the applies of this process one at a time; the
	// plan's rename makes a plan one use across processes too.
	applyMu sync.Mutex
}

// New checks cfg and makes the state folder.
func New(cfg Config) (*Runner, error) {
	return newRunner(cfg, nil)
}

// newRunner is New with the dial of checked addresses (tests point a
// checked public address at a local server).
func newRunner(cfg Config, dial dialFunc) (*Runner, error) {
	if cfg.StateDir == "" {
		return nil, errors.New("action: no state folder")
	}
	r := &Runner{stateDir: cfg.StateDir, runtime: cfg.Runtime, runtimeBinary: cfg.RuntimeBinary, busybox: cfg.Busybox,
		clock: cfg.Clock, log: cfg.Log, timeout: cfg.Timeout}
	switch r.runtime {
	case "":
		r.runtime = RuntimeRunc
	case RuntimeRunc, RuntimeRunsc:
	default:
		return nil, fmt.Errorf("action: unknown runtime %q", cfg.Runtime)
	}
	if r.clock == nil {
		r.clock = clock.Real{}
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if r.timeout <= 0 {
		r.timeout = DefaultTimeout
	}
	g, err := newGuard(cfg.Anchored, cfg.Resolver, cfg.Local, dial)
	if err != nil {
		return nil, err
	}
	r.guard = g
	for _, d := range []string{r.stateDir, filepath.Join(r.stateDir, "plans"), filepath.Join(r.stateDir, "run")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("action: state folder: %w", err)
		}
		if err := os.Chmod(d, 0o700); err != nil {
			return nil, fmt.Errorf("action: state folder: %w", err)
		}
	}
	return r, nil
}

// binary returns the runtime's path.
func (r *Runner) binary() (string, error) {
	if r.runtimeBinary != "" {
		return r.runtimeBinary, nil
	}
	p, err := exec.LookPath(r.runtime)
	if err != nil {
		return "", fmt.Errorf("action: %s: %w", r.runtime, err)
	}
	return p, nil
}
