package cli

import (
	"io"

	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/internal/clisafe"
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
			out := jsonStream{clisafe.Raw(cmd.OutOrStdout())}
			return mcpgate.New(mcpgate.Options{Log: log}).ServeStdio(cmd.Context(), c, in, nopWriteCloser{out})
		}}
}

// jsonStream writes the gate's JSON-RPC messages unchanged in meaning:
// not through the terminal filter (clisafe.Writer), which would drop DEL
// and the C1 controls from the strings an agent reads, but with those
// escaped as \u00XX (clisafe.EscapeJSON), so the stream stays safe on a
// terminal too. The SDK writes each message with one Write.
type jsonStream struct{ w io.Writer }

// Write writes p with DEL and the C1 controls escaped; it reports all of
// p written once the escaped bytes are.
func (j jsonStream) Write(p []byte) (int, error) {
	if _, err := j.w.Write(clisafe.EscapeJSON(p)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// nopWriteCloser is a writer whose Close does nothing: the process's
// stdout outlives the MCP session.
type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
