package bcdcli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/daemon/driver"
	"github.com/bettercompute/bettercompute/internal/daemon/plugin"
)

// pluginCmds are the driver-plugin commands: `bcd driver-plugin sim`, which
// serves the sim driver over the plugin protocol (so the sim driver runs as
// a confined plugin in tests), and the hidden shim `bcd __bcx-exec` that
// bcd starts to become a confined plugin.
func pluginCmds() []*cobra.Command {
	return []*cobra.Command{driverPluginCmd(), shimCmd()}
}

func driverPluginCmd() *cobra.Command {
	group := &cobra.Command{Use: "driver-plugin", Short: "Serve a built-in driver over the bcx driver plugin protocol (stdin/stdout)"}
	var host string
	sim := &cobra.Command{
		Use:   "sim",
		Short: "Serve the sim driver as a plugin; its name comes from BCX_PLUGIN_NAME (default sim)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			name := os.Getenv("BCX_PLUGIN_NAME")
			if name == "" {
				name = "sim"
			}
			// The protocol's own stdin and stdout, not the command's
			// (whose writer filters runes for a terminal).
			return plugin.Serve(cmd.Context(), name, driver.NewSim(host), os.Stdin, os.Stdout)
		},
	}
	sim.Flags().StringVar(&host, "hostname", hostname(), "hostname the sim machine reports")
	group.AddCommand(sim)
	return group
}

func shimCmd() *cobra.Command {
	return &cobra.Command{
		Use:                plugin.ShimCommand,
		Hidden:             true,
		DisableFlagParsing: true,
		RunE: func(_ *cobra.Command, args []string) error {
			// Only bcd node starts the shim (with the plugin's name in the
			// environment and its file and gate on fds 3 and 4).
			if os.Getenv("BCX_PLUGIN_NAME") == "" {
				return &ExitError{Code: 2, Err: errors.New("bcd " + plugin.ShimCommand + " is started by bcd node for a plugin, never by hand")}
			}
			return plugin.ShimMain(args, os.Environ())
		},
	}
}

// pluginOptions are bcd node's driver-plugin flags.
type pluginOptions struct {
	path, sha256     string
	args             []string
	memoryMB, pids   int64
	cgroupRoot, name string
}

// addPluginFlags adds bcd node's driver-plugin flags to c.
func addPluginFlags(c *cobra.Command, o *pluginOptions) {
	c.Flags().StringVar(&o.path, "plugin", "", "run the driver as a confined plugin: this binary (a bcx driver, or bcd itself with --plugin-arg driver-plugin --plugin-arg sim), pinned with --plugin-sha256; its own uid, no_new_privs, a seccomp filter, its own cgroups")
	c.Flags().StringVar(&o.sha256, "plugin-sha256", "", "SHA-256 (hex) of the --plugin binary; a different file is refused before it runs")
	c.Flags().StringArrayVar(&o.args, "plugin-arg", nil, "an argument of the plugin (repeatable)")
	c.Flags().StringVar(&o.name, "plugin-name", "driver", "the plugin's name: its uid is derived from it")
	c.Flags().Int64Var(&o.memoryMB, "plugin-memory-mb", 512, "the plugin cgroup's memory limit (MiB)")
	c.Flags().Int64Var(&o.pids, "plugin-pids", 256, "the plugin cgroup's pids limit")
	c.Flags().StringVar(&o.cgroupRoot, "plugin-cgroup-root", "/sys/fs/cgroup", "where the cgroup hierarchies are mounted")
}

// startPlugin starts the pinned driver plugin confined; close kills it.
func startPlugin(ctx context.Context, o pluginOptions, log *slog.Logger) (*plugin.Plugin, error) {
	if o.sha256 == "" {
		return nil, &ExitError{Code: 2, Err: errors.New("--plugin needs --plugin-sha256")}
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("bcd node: %w", err)
	}
	l := &plugin.Launcher{Exe: exe, Root: os.Geteuid() == 0, Clock: clock.Real{}, Log: log, Stderr: os.Stderr}
	if l.Root {
		if l.IDs, err = plugin.AssignIDs([]string{o.name}, plugin.AccountTaken); err != nil {
			return nil, &ExitError{Code: 2, Err: err}
		}
		l.Cgroup = &plugin.CgroupConfig{Root: o.cgroupRoot, Parent: "bcd-plugins", MemoryMax: o.memoryMB << 20, PidsMax: o.pids}
	}
	return l.Start(ctx, plugin.Spec{Name: o.name, Path: o.path, SHA256: o.sha256, Args: o.args})
}
