package bcdcli

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/daemon/sandbox"
	"github.com/bettercompute/bettercompute/internal/daemon/sshaccess"
	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
)

// nodeOptions are bcd node's flags.
type nodeOptions struct {
	dir, drv, gw, level, sshdDir, helperSock string
	sbx                                      sandbox.Options
	plug                                     pluginOptions
	tunnelPorts                              []uint
}

func nodeCmd() *cobra.Command {
	var o nodeOptions
	c := &cobra.Command{
		Use:   "node",
		Short: "Run the node agent: hold the session, verify and run signed commands",
		Long: "Run the node agent: hold the session with the gateway (reconnecting with back-off when it drops), verify and run signed commands.\n\n" +
			"When the control plane has revoked this node's certificate (nodes revoke, or a quarantine), bcd node says so, prints how to re-join " +
			"(a new join token and bcd join into a fresh --data) and exits 1 instead of reconnecting.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runNode(ctx, cmd, o)
		},
	}
	addNodeFlags(c, &o)
	return c
}

// runNode builds the node's driver stack (plugin, sandbox host or root
// helper, ssh.access) and runs the agent until ctx ends.
func runNode(ctx context.Context, cmd *cobra.Command, o nodeOptions) error {
	var l slog.Level
	_ = l.UnmarshalText([]byte(o.level))
	log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: l}))
	d, closeDriver, err := nodeDriver(ctx, cmd, o, log)
	if err != nil {
		return err
	}
	defer closeDriver()
	ports, err := daemon.ParseTunnelPorts("--tunnel-port", o.tunnelPorts)
	if err != nil {
		return &ExitError{Code: 2, Err: err}
	}
	hd, _ := d.(*sandbox.HelperDriver)
	cfg := daemon.Config{DataDir: o.dir, Gateway: o.gw, Clock: clock.Real{}, Log: log, TunnelPorts: ports}
	var sa *sshaccess.Driver
	if hd != nil {
		// ssh.access goes to the helper with its signed command: the
		// helper writes sshd's files itself.
		cfg.Driver, cfg.HelperEvents = hd, helperEvents(&helperwire.Client{Socket: o.helperSock})
	} else {
		sa = &sshaccess.Driver{Driver: d, Dir: sshdDirFor(o.sshdDir, o.drv, o.dir), StateDir: o.dir}
		cfg.Driver = sa
	}
	n, err := daemon.Open(cfg)
	if err != nil {
		return err
	}
	defer n.Close()
	if hd != nil {
		hd.Intent, hd.Bundle = n.Intent, n.TrustBundle
		go hd.WatchFailures(ctx, time.Second)
		log.Info("unprivileged node: root operations go through the helper", "socket", o.helperSock)
	} else {
		sa.SetNodeID(n.NodeID())
	}
	log.Info("node agent starting", "node_id", n.NodeID(), "driver", o.drv)
	return n.Run(ctx)
}

// nodeDriver is the machine's driver (or its confined plugin) with the
// sandbox kinds in front: the root helper's on an unprivileged node, the
// node's own sandbox host on a root node.
func nodeDriver(ctx context.Context, cmd *cobra.Command, o nodeOptions, log *slog.Logger) (driver.Driver, func(), error) {
	d, err := driver.New(o.drv, hostname())
	if err != nil {
		return nil, nil, &ExitError{Code: 2, Err: err}
	}
	closeDriver := func() {}
	if o.plug.path != "" {
		if o.helperSock != "" {
			return nil, nil, &ExitError{Code: 2, Err: errors.New("--plugin needs a root node: an unprivileged node (--helper-socket) cannot give a plugin its own uid")}
		}
		p, err := startPlugin(ctx, o.plug, log)
		if err != nil {
			return nil, nil, err
		}
		closeDriver = func() { p.Close() }
		d = p
	}
	if o.helperSock != "" {
		if cmd.Flags().Changed("sandbox-runtime") || cmd.Flags().Changed("image-store") {
			return nil, nil, &ExitError{Code: 2, Err: errors.New("--sandbox-runtime and --image-store are root's with --helper-socket: set them in the helper's configuration")}
		}
		return &sandbox.HelperDriver{Driver: d, Client: &helperwire.Client{Socket: o.helperSock}, Clock: clock.Real{}, Log: log}, closeDriver, nil
	}
	if o.sbx.Runtime != "none" {
		if d, err = openSandboxHost(ctx, cmd, o.sbx, o.dir, log, d); err != nil {
			closeDriver()
			return nil, nil, err
		}
	}
	return d, closeDriver, nil
}

// addNodeFlags adds bcd node's flags to c.
func addNodeFlags(c *cobra.Command, o *nodeOptions) {
	c.Flags().StringVar(&o.dir, "data", "/var/lib/bcd", "state directory")
	c.Flags().StringVar(&o.drv, "driver", "linux", "driver: linux or sim")
	c.Flags().StringVar(&o.gw, "gateway", "", "gateway address (default: the one joined)")
	c.Flags().StringVar(&o.level, "log-level", "info", "log level")
	c.Flags().UintSliceVar(&o.tunnelPorts, "tunnel-port", []uint{22}, "a port on 127.0.0.1 that tunnels may reach (repeatable, or comma-separated); no other port or address is ever dialled")
	c.Flags().StringVar(&o.sshdDir, "sshd-dir", "", "where ssh.access writes the break-glass sshd files (default "+DefaultSSHDDir+" on the linux driver, DATA/sshd on sim); bcd sshd-config prints the sshd_config lines")
	addPluginFlags(c, &o.plug)
	c.Flags().StringVar(&o.helperSock, "helper-socket", "", "run unprivileged: sandboxes (and the other root operations) go through bcd helper on this socket, which checks each request itself")
	sbx := &o.sbx
	c.Flags().StringVar(&sbx.Runtime, "sandbox-runtime", "auto", "sandbox runtime: auto (runc when usable), runc, runsc, runc,runsc (both side by side; each must work, and each sandbox runs on the one its template names), sim or none")
	c.Flags().StringVar(&sbx.ImageStore, "image-store", "", "gocloud.dev/blob URL of the sandbox image store (file:///dir, s3://…)")
	c.Flags().IntVar(&sbx.Slots, "sandbox-slots", 16, "most sandboxes at once")
	c.Flags().Int64Var(&sbx.MemoryMB, "sandbox-memory-mb", 8192, "most memory (MiB) all sandboxes' limits may add up to")
	c.Flags().StringVar(&sbx.Egress, "sandbox-egress", "auto", "network egress for sandboxes through the egress proxy: auto (when iproute2 and nftables work) or off")
	c.Flags().StringVar(&sbx.EgressRange, "sandbox-egress-range", sandbox.DefaultEgressRange, "IPv4 range the sandboxes' links are cut from (a /30 each); must be unused on this machine's networks")
	c.Flags().IntVar(&sbx.EgressPort, "sandbox-egress-port", sandbox.DefaultEgressPort, "the egress proxy's port on each sandbox link (the same for every bcd on a machine)")
	c.Flags().Uint32Var(&sbx.IDBase, "sandbox-id-base", sandbox.DefaultIDBase, "first host uid/gid of the range reserved for runc sandboxes' user namespaces (sandbox-slots blocks of sandbox-id-size ids); nothing else on the machine may use it")
	c.Flags().Uint32Var(&sbx.IDSize, "sandbox-id-size", sandbox.DefaultIDSize, "host uids/gids per runc sandbox (at least 65536)")
}
