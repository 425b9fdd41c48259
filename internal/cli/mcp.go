package cli

import (
	"io"

	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/internal/mcpgate"
)

// mcpCmd serves the MCP gate (internal/mcpgate) over standard input and
// output for an agent, with the API address and key of the environment
// (BC_ADDR, BC_API_KEY_FILE or BC_API_KEY, BC_CA_FILE), never from argv.
func mcpCmd() *cobra.Command {
	return &cobra.Command{Use: "mcp", Short: "Serve the MCP gate for an agent over stdin/stdout, with your API key", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := apiClient()
			if err != nil {
				return err
			}
			log := newLogger(cmd.ErrOrStderr(), "warn")
			in := io.NopCloser(cmd.InOrStdin())
			return mcpgate.New(mcpgate.Options{Log: log}).ServeStdio(cmd.Context(), c, in, nopWriteCloser{cmd.OutOrStdout()})
		}}
}

// nopWriteCloser is a writer whose Close does nothing: the process's
// stdout outlives the MCP session.
type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
