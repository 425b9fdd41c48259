package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/clisafe"
)

// bastionsOpCmd is `better-compute bastions op`: one op with a fixed shape
// on a bastion. An approval request exits ExitApprovalRequired after
// saying what to run on the machine.
func bastionsOpCmd() *cobra.Command {
	var in client.BastionOpIn
	var args string
	var asJSON bool
	c := &cobra.Command{
		Use:   "op --bastion ID --kind KIND [--args JSON] [--approval APR] [--json]",
		Short: "Send an op to a bastion (observe:disk, files:read, files:move-plan, ...); writes wait for its person's approval on the machine",
		Long: "Send one op of a fixed shape to the bastion through the control plane's tunnel, decided compute:bastions:op " +
			"on the bastion here and checked again by the bastion against the kind's schema. A write needs its person's " +
			"approval, given on the machine with a code: the command then prints what to run there and exits 4; run the " +
			"same command again with --approval APR once it is approved.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if in.BastionID == "" || in.Kind == "" {
				return &ExitError{Code: 2, Err: errors.New("--bastion and --kind are required")}
			}
			var obj map[string]json.RawMessage
			if json.Unmarshal([]byte(args), &obj) != nil || obj == nil {
				return &ExitError{Code: 2, Err: errors.New("--args: not a JSON object, such as '{\"share\":\"sh_...\",\"path\":\"notes.txt\"}'")}
			}
			in.Args = json.RawMessage(args)
			cl, err := apiClient()
			if err != nil {
				return err
			}
			a, err := cl.BastionOp(contextOf(cmd), in)
			if err != nil {
				return apiErr(err)
			}
			return printOpAnswer(cmd, a, asJSON)
		},
	}
	c.Flags().StringVar(&in.BastionID, "bastion", "", "bastion id")
	c.Flags().StringVar(&in.Kind, "kind", "", "the op's kind, such as observe:disk or files:read")
	c.Flags().StringVar(&args, "args", "{}", "the op's arguments, a JSON object")
	c.Flags().StringVar(&in.Approval, "approval", "", "the approval request the person approved on the machine (apr_...)")
	c.Flags().BoolVar(&asJSON, "json", false, "print the whole answer as JSON")
	return c
}

// printOpAnswer prints an op's result (or, with asJSON, the whole
// answer); an approval request goes to standard error with its summary
// and exits ExitApprovalRequired.
func printOpAnswer(cmd *cobra.Command, a client.BastionOpAnswer, asJSON bool) error {
	if asJSON {
		if err := printJSON(cmd.OutOrStdout(), a); err != nil {
			return err
		}
	}
	if a.Status == "approval-required" {
		fmt.Fprintf(cmd.ErrOrStderr(), "approval required: on the bastion's machine run: bcd bastion approve %s\n", a.ApprovalRequest)
		if a.Summary != "" {
			fmt.Fprintf(cmd.ErrOrStderr(), "it shows the person:\n%s\n", a.Summary)
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "then repeat this command with --approval %s\n", a.ApprovalRequest)
		return &ExitError{Code: ExitApprovalRequired}
	}
	if asJSON {
		return nil
	}
	var v any
	if err := json.Unmarshal(a.Result, &v); err != nil {
		return fmt.Errorf("the op's result is not JSON: %w", err)
	}
	return printJSON(cmd.OutOrStdout(), v)
}

// bastionsTerminalCmd is `better-compute bastions terminal`: a terminal
// on a bastion, once its person approved this session on the machine.
func bastionsTerminalCmd() *cobra.Command {
	var bastion, session, approval string
	var root bool
	c := &cobra.Command{
		Use:   "terminal --bastion ID [--root] [--session TS] [--approval APR]",
		Short: "Open a terminal on a bastion, once its person approved this session on the machine",
		Long: "Open a terminal (a PTY as the bastion's user, or root with --root when the bastion runs as root) through the " +
			"control plane's tunnel, decided compute:bastions:terminal here. The person approves each session on the machine " +
			"with a code: the first request prints the session id and what to run there and exits 4; repeat it with " +
			"--session TS --approval APR. The bastion writes the session with its output to a transcript and the audit log.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if bastion == "" {
				return &ExitError{Code: 2, Err: errors.New("--bastion is required")}
			}
			if session == "" && approval != "" {
				return &ExitError{Code: 2, Err: errors.New("--approval needs the --session it was given for")}
			}
			if session == "" {
				session = client.NewTerminalSession()
				fmt.Fprintf(cmd.ErrOrStderr(), "session %s\n", session)
			}
			cl, err := apiClient()
			if err != nil {
				return err
			}
			conn, err := cl.BastionTerminal(contextOf(cmd), bastion, session, root, approval)
			var ce *client.Error
			if errors.As(err, &ce) && ce.Code == client.ErrApprovalRequired.Code {
				fmt.Fprintf(cmd.ErrOrStderr(), "approval required: %s\n", ce.Message)
				return &ExitError{Code: ExitApprovalRequired}
			}
			if err != nil {
				return apiErr(err)
			}
			defer conn.Close()
			return spliceTerminal(cmd, conn)
		},
	}
	c.Flags().StringVar(&bastion, "bastion", "", "bastion id")
	c.Flags().BoolVar(&root, "root", false, "a root terminal (the bastion must run as root)") // archtest:not-tenant (a root terminal flag)
	c.Flags().StringVar(&session, "session", "", "the session id (ts_...; default: a new one, printed)")
	c.Flags().StringVar(&approval, "approval", "", "the approval request the person approved for this session (apr_...)")
	return c
}

// spliceTerminal carries standard input to the terminal and its output to
// standard output (unfiltered: it is the bastion's terminal, as with ssh)
// until the terminal ends; a terminal on standard input is in raw mode
// meanwhile and restored after.
func spliceTerminal(cmd *cobra.Command, conn io.ReadWriteCloser) error {
	in := cmd.InOrStdin()
	if f, ok := in.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		fd := int(f.Fd())
		if old, err := term.MakeRaw(fd); err == nil {
			defer func() { _ = term.Restore(fd, old) }()
		}
	}
	go func() { _, _ = io.Copy(conn, in) }()
	_, err := io.Copy(clisafe.Raw(cmd.OutOrStdout()), conn)
	return err
}
