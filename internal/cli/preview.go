package cli

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
)

// sandboxPreviewCmd makes a preview URL of a port in a sandbox.
func sandboxPreviewCmd() *cobra.Command {
	var port int
	var ttl time.Duration
	var j bool
	c := &cobra.Command{Use: "preview ID --port P [--ttl 1h]", Short: "Make a URL that serves a port of a running sandbox over HTTP (WebSockets too) until it expires (the URL is a credential: share it only with whom should see the app)",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if port < 1 || port > 65535 {
				return &ExitError{Code: 2, Err: errors.New("--port: 1 to 65535")}
			}
			if ttl%time.Second != 0 || ttl < 0 {
				return &ExitError{Code: 2, Err: errors.New("--ttl: whole seconds, 1m to 24h")}
			}
			return call(cmd, "sandboxes.preview", map[string]any{"id": args[0], "port": port, "ttl_seconds": int64(ttl / time.Second)}, j,
				func(o map[string]any) string { return fmt.Sprintf("%v\n", o["url"]) })
		}}
	c.Flags().IntVar(&port, "port", 0, "the port inside the sandbox (required)")
	c.Flags().DurationVar(&ttl, "ttl", time.Hour, "how long the URL works (at most 24h, and never past the sandbox's deadline)")
	c.Flags().BoolVar(&j, "json", false, "print JSON")
	return c
}

// previewCmd holds the deployment's preview key operations.
func previewCmd() *cobra.Command {
	c := &cobra.Command{Use: "preview", Short: "Sandbox preview URLs: the key that signs them"}
	var j bool
	rotate := &cobra.Command{Use: "rotate-key", Short: "Replace the preview key: every preview URL issued before stops working at once", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, "previews.rotateKey", map[string]any{}, j,
				func(o map[string]any) string { return fmt.Sprintf("new preview key %v\n", o["key_id"]) })
		}}
	rotate.Flags().BoolVar(&j, "json", false, "print JSON")
	c.AddCommand(rotate)
	return c
}
