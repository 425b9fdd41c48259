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
	"syscall"

	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/hosthelper"
)

// DefaultHelperSocket is where bcd helper listens and bcd node calls it.
const DefaultHelperSocket = "/run/bcd-helper/helper.sock"

// helperOptions are bcd helper's flags.
type helperOptions struct {
	socket, nodeUser, level string
	pins                    []string
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
	return c
}

// runHelper resolves the node account, builds the server, binds the socket
// and serves until ctx ends.
func runHelper(ctx context.Context, cmd *cobra.Command, o helperOptions, ready func()) error {
	var l slog.Level
	if err := l.UnmarshalText([]byte(o.level)); err != nil {
		return &ExitError{Code: 2, Err: fmt.Errorf("--log-level: %w", err)}
	}
	log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: l}))
	uid, gid, err := lookupAccount(o.nodeUser)
	if err != nil {
		return &ExitError{Code: 2, Err: err}
	}
	cfg := hosthelper.Config{NodeUID: uid, NodeGID: gid, Log: log, Clock: clock.Real{}}
	for _, p := range o.pins {
		pin, err := hosthelper.ParsePin(p)
		if err != nil {
			return &ExitError{Code: 2, Err: fmt.Errorf("--exe-sha256: %w", err)}
		}
		cfg.ExeSHA256 = append(cfg.ExeSHA256, pin)
	}
	srv, err := hosthelper.New(cfg)
	if err != nil {
		return err
	}
	if err := registerHelperOps(srv, log); err != nil {
		return err
	}
	if err := ensureSocketDir(filepath.Dir(o.socket)); err != nil {
		return err
	}
	ln, err := hosthelper.Listen(o.socket, 0, int(gid))
	if err != nil {
		return fmt.Errorf("bcd helper: %w", err)
	}
	log.Info("helper listening", "socket", o.socket, "node_uid", uid, "node_gid", gid, "pins", len(cfg.ExeSHA256))
	if ready != nil {
		ready()
	}
	return srv.Serve(ctx, ln)
}

// registerHelperOps registers the helper's host operations beyond the
// built-in ping and events.drain. None yet: the file, firewall, GPU,
// reboot and sandbox operations are added here as they are built.
func registerHelperOps(_ *hosthelper.Server, _ *slog.Logger) error { return nil }

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
