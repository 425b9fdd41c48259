package bcdcli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/hosthelper"
	"github.com/bettercompute/bettercompute/internal/hosthelper/helperconfig"
	"github.com/bettercompute/bettercompute/internal/hosthelper/helperd"
)

// DefaultHelperSocket is where bcd helper listens and bcd node calls it.
const DefaultHelperSocket = "/run/bcd-helper/helper.sock"

// helperOptions are bcd helper's flags.
type helperOptions struct {
	socket, nodeUser, level, config, stateDir string
	pins                                      []string
}

func helperCmd() *cobra.Command { return newHelperCmd(nil) }

// newHelperCmd builds bcd helper; ready, when set, is called once the
// socket is listening (tests wait on it instead of polling).
func newHelperCmd(ready func()) *cobra.Command {
	var o helperOptions
	c := &cobra.Command{
		Use:   "helper",
		Short: "Run the root helper: serve the unprivileged node agent's typed root operations on a Unix socket",
		Long: "Run the root helper (as root). It serves only callers whose kernel-reported uid and gid are the node account's " +
			"(or root's) and whose executable is an installed bcd (this binary, or one pinned with --exe-sha256), decodes every " +
			"request strictly, and logs every operation and refusal.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runHelper(ctx, cmd, o, ready)
		},
	}
	c.Flags().StringVar(&o.socket, "socket", DefaultHelperSocket, "the helper's socket; its directory must be root's and closed to group and other writes")
	c.Flags().StringVar(&o.nodeUser, "node-user", "bcd", "the node agent's account: its uid and primary gid may call the helper")
	c.Flags().StringArrayVar(&o.pins, "exe-sha256", nil, "SHA-256 (hex) of a bcd executable accepted besides this one (repeatable)")
	c.Flags().StringVar(&o.level, "log-level", "info", "log level")
	c.Flags().StringVar(&o.stateDir, "state-dir", helperconfig.DefaultStateDir, "the helper's own state (0700 root): accepted roots, applied generation, replay store, sandboxes")
	c.Flags().StringVar(&o.config, "config", "", "root's helper configuration ("+helperconfig.Path+", written by bcd install --unprivileged): socket, node account, pins, sandbox runtime; the flags above may not be given with it")
	return c
}

// runHelper resolves the configuration and the node account, builds the
// helper (helperd), binds the socket and serves until ctx ends.
func runHelper(ctx context.Context, cmd *cobra.Command, o helperOptions, ready func()) error {
	var l slog.Level
	if err := l.UnmarshalText([]byte(o.level)); err != nil {
		return &ExitError{Code: 2, Err: fmt.Errorf("--log-level: %w", err)}
	}
	log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: l}))
	conf, err := helperConfig(cmd, o)
	if err != nil {
		return &ExitError{Code: 2, Err: err}
	}
	uid, gid, err := lookupAccount(conf.NodeUser)
	if err != nil {
		return &ExitError{Code: 2, Err: err}
	}
	h, err := helperd.Open(ctx, helperd.Options{Config: conf, NodeUID: uid, NodeGID: gid, Log: log, Clock: clock.Real{}})
	if err != nil {
		return err
	}
	defer h.Close()
	if err := ensureSocketDir(filepath.Dir(conf.Socket)); err != nil {
		return err
	}
	ln, err := hosthelper.Listen(conf.Socket, 0, int(gid))
	if err != nil {
		return fmt.Errorf("bcd helper: %w", err)
	}
	log.Info("helper listening", "socket", conf.Socket, "node_uid", uid, "node_gid", gid, "pins", len(conf.ExeSHA256),
		"root_pins", len(conf.CommandRootSHA256), "sandbox_runtime", conf.SandboxRuntime)
	if len(conf.CommandRootSHA256) == 0 && conf.JoinKeyPin == "" {
		log.Warn("no command root or join key pinned: every host-changing operation is refused")
	}
	if ready != nil {
		ready()
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); h.Run(runCtx) }()
	defer func() { stop(); <-done }()
	return h.Server.Serve(ctx, ln)
}

// helperConfig is root's file when --config is given (the other flags
// may not be), else the defaults with the flags.
func helperConfig(cmd *cobra.Command, o helperOptions) (helperconfig.Config, error) {
	if o.config != "" {
		for _, f := range []string{"socket", "node-user", "exe-sha256", "state-dir"} {
			if cmd.Flags().Changed(f) {
				return helperconfig.Config{}, fmt.Errorf("--%s may not be given with --config: set it in the file", f)
			}
		}
		return helperconfig.Load(o.config)
	}
	c := helperconfig.Default()
	c.Socket, c.NodeUser, c.StateDir = o.socket, o.nodeUser, o.stateDir
	for _, p := range o.pins {
		if _, err := hosthelper.ParsePin(p); err != nil {
			return helperconfig.Config{}, fmt.Errorf("--exe-sha256: %w", err)
		}
		c.ExeSHA256 = append(c.ExeSHA256, strings.ToLower(p))
	}
	if err := c.Validate(); err != nil {
		return helperconfig.Config{}, err
	}
	return c, nil
}

// lookupAccount resolves the node account's uid and primary gid.
func lookupAccount(name string) (uint32, uint32, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return 0, 0, fmt.Errorf("--node-user %q: %w", name, err)
	}
	uid, uerr := strconv.ParseUint(u.Uid, 10, 32)
	gid, gerr := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(uerr, gerr); err != nil {
		return 0, 0, fmt.Errorf("--node-user %q: %w", name, err)
	}
	return uint32(uid), uint32(gid), nil
}

// ensureSocketDir makes the socket's directory (root's, 0755) when it does
// not exist; an existing one is left for Listen to check.
func ensureSocketDir(dir string) error {
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("bcd helper: socket directory: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil { // whatever the umask
		return fmt.Errorf("bcd helper: socket directory: %w", err)
	}
	return nil
}
