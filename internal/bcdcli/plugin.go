package bcdcli

import (
	"os"

	"github.com/spf13/cobra"

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
			return plugin.ShimMain(args, os.Environ())
		},
	}
}
