// Package cli is the better-compute command line: the control plane's
// processes (dev, serve, pki) and the operator CLI over the public API.
// Every read takes --json.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/buildinfo"
	"github.com/bettercompute/bettercompute/internal/clisafe"
	"github.com/bettercompute/bettercompute/internal/jsontime"
)

// ExitError carries a process exit status; main exits with Code.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit %d", e.Code)
	}
	return e.Err.Error()
}

func (e *ExitError) Unwrap() error { return e.Err }

// Main runs the CLI with args and returns the process exit status.
func Main(args []string, stdout, stderr io.Writer) int {
	return MainContext(context.Background(), args, stdout, stderr)
}

// MainContext is Main under ctx: a long-running command (serve, tunnel,
// bastions connect) ends when ctx does.
func MainContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := NewRoot()
	root.SetContext(ctx)
	stdout = &clisafe.Writer{W: stdout}
	stderr = &clisafe.Writer{W: stderr}
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteC()
	err = programStatus(cmd, explain(cmd, err))
	if err == nil {
		return 0
	}
	var ue *clisafe.UsageError
	if errors.As(err, &ue) {
		fmt.Fprintln(stderr, "error:", ue)
		return 2
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		if ee.Err != nil {
			fmt.Fprintln(stderr, "error:", ee.Err)
		}
		return ee.Code
	}
	fmt.Fprintln(stderr, "error:", err)
	return 1
}

// NewRoot builds the command tree.
func NewRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "better-compute",
		Short:         "Better Compute: the control plane for machines that run other people's code",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(devCmd(), serveCmd(), pkiCmd(), nodesCmd(), joinTokensCmd(), commandsCmd(),
		tenantsCmd(), identitiesCmd(), rolesCmd(), bindingsCmd(), apiKeysCmd(), secretsCmd(), sshCertCmd())
	root.AddCommand(sessionsCmd(), approvalsCmd())
	root.AddCommand(batchCmd(), approversCmd())
	root.AddCommand(auditCmd())
	root.AddCommand(bootstrapCmd())
	root.AddCommand(sandboxCommands()...)
	root.AddCommand(tunnelCmd(), sshCmd())
	root.AddCommand(revocationsCmd())
	root.AddCommand(bastionsCmd())
	root.AddCommand(mcpCmd())
	addLifecycleCommands(root)
	buildinfo.AddVersionFlag(root)
	addCAFlag(root)
	addCompletions(root)
	clisafe.GuardArgs(root)
	return root
}

func newLogger(w io.Writer, level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))
}

// printJSON writes v indented, with DEL and the C1 controls escaped so
// that server text cannot act on a terminal through --json either.
func printJSON(w io.Writer, v any) error {
	js, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode json: %w", err)
	}
	_, err = w.Write(append(clisafe.EscapeJSON(jsontime.Normalize(js)), '\n'))
	return err
}

func apiClient() (*client.Client, error) {
	c, err := client.FromEnvCA(caFile())
	if err != nil {
		return nil, &ExitError{Code: 2, Err: err}
	}
	return c, nil
}

// apiErr turns an API error into a readable one (code and message).
func apiErr(err error) error {
	var e *client.Error
	if errors.As(err, &e) {
		return fmt.Errorf("%s: %s", e.Code, e.Message)
	}
	return err
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func pad(s string, n int) string {
	if len(s) >= n {
		return s
	}
	return s + strings.Repeat(" ", n-len(s))
}
