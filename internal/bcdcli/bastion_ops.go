package bcdcli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/internal/bastion/agent"
	"github.com/bettercompute/bettercompute/internal/bastion/approval"
	"github.com/bettercompute/bettercompute/internal/bastion/ops"
	"github.com/bettercompute/bettercompute/internal/bastion/share"
	"github.com/bettercompute/bettercompute/internal/clock"
)

// The bastion's on-machine commands: the person's side of approvals.
// Each runs on the machine, beside `bcd bastion run`, on the same data
// folder; a code is read from the terminal (or standard input), never
// from an argument or the environment.

// codeRE is a six-digit TOTP code.
var codeRE = regexp.MustCompile(`^[0-9]{6}$`)

// readCode reads a second-factor code from stdin (without echo on a
// terminal).
func readCode(stdin io.Reader, stderr io.Writer) (string, error) {
	c, err := readTokenFrom("", "code from your authenticator", stdin, stderr)
	if err != nil {
		return "", &ExitError{Code: 2, Err: errors.New("no code: enter the six digits your authenticator shows")}
	}
	if !codeRE.MatchString(c) {
		return "", &ExitError{Code: 2, Err: errors.New("a code is six digits")}
	}
	return c, nil
}

// openApprovals opens dir's approval store, as exit code 2 on failure.
func openApprovals(dir string) (*approval.Store, error) {
	st, err := agent.OpenApprovals(dir, clock.Real{})
	if err != nil {
		return nil, &ExitError{Code: 2, Err: err}
	}
	return st, nil
}

// refusal turns a store refusal into exit code 1 with its reason.
func refusal(err error) error {
	if err == nil {
		return nil
	}
	return &ExitError{Code: 1, Err: err}
}

// needRoot refuses unless this process runs as root and the bastion of
// dir does too (its folder is root's): the anchor and the root command
// grant are machine-wide facts, and a record root wrote in a person's
// bastion folder could not be read by that bastion.
func needRoot(what, dir string) error {
	if os.Geteuid() != 0 {
		return &ExitError{Code: 2, Err: fmt.Errorf("%s needs root on this machine", what)}
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return &ExitError{Code: 2, Err: fmt.Errorf("%s: %w", what, err)}
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 {
		return &ExitError{Code: 2, Err: fmt.Errorf("%s is for a bastion that runs as root; the bastion of %s runs as user %d", what, dir, st.Uid)}
	}
	return nil
}

// parseWhen is an RFC 3339 time or a duration from now ("2h").
func parseWhen(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		return now.Add(d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, &ExitError{Code: 2, Err: fmt.Errorf("%q: want an RFC 3339 time or a duration such as 2h", s)}
	}
	return t, nil
}

// printJSON writes v as indented JSON.
func printJSON(w io.Writer, v any) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(v)
}

// bastionOpsCmds are the approval commands added under `bcd bastion`.
func bastionOpsCmds(stdin io.Reader) []*cobra.Command {
	return []*cobra.Command{bastionEnrollCmd(), bastionPendingCmd(), bastionApproveCmd(stdin), bastionDenyCmd(),
		bastionShareCmd(), bastionSharesCmd(), bastionUnshareCmd(), bastionStandingCmd(stdin), bastionRootGrantCmd(stdin),
		bastionAnchorCmd(stdin)}
}

// dataFlag adds --data to c.
func dataFlag(c *cobra.Command, dir *string) {
	c.Flags().StringVar(dir, "data", DefaultBastionDir(), "the bastion's state directory")
}

func bastionEnrollCmd() *cobra.Command {
	var dir, account string
	c := &cobra.Command{
		Use:   "enroll [--data DIR] [--account NAME]",
		Short: "Enroll a second factor (TOTP) on this machine: shown once as an otpauth:// URI and a QR code",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := openApprovals(dir)
			if err != nil {
				return err
			}
			uri, err := st.Enroll(account)
			if err != nil {
				return refusal(err)
			}
			qr, err := approval.QR(uri)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s\n%s\nAdd it to your authenticator now: it is not shown again.\n", qr, uri)
			return nil
		},
	}
	dataFlag(c, &dir)
	c.Flags().StringVar(&account, "account", hostname(), "the account name your authenticator shows")
	return c
}

func bastionPendingCmd() *cobra.Command {
	var dir string
	var asJSON bool
	c := &cobra.Command{
		Use:   "pending [--data DIR] [--json]",
		Short: "List the requests waiting for your approval on this machine",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := openApprovals(dir)
			if err != nil {
				return err
			}
			rs, err := st.Pending()
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), map[string]any{"requests": rs})
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tOP\tEXPIRES\tAPPROVED")
			for _, r := range rs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%v\n", r.ID, r.Op, r.Expires.Format(time.RFC3339), r.Approved)
			}
			return tw.Flush()
		},
	}
	dataFlag(c, &dir)
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func bastionApproveCmd(stdin io.Reader) *cobra.Command {
	var dir string
	c := &cobra.Command{
		Use:   "approve REQUEST [--data DIR]",
		Short: "Approve one pending request with a code from your authenticator (read from the terminal)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := openApprovals(dir)
			if err != nil {
				return err
			}
			r, err := st.Get(args[0])
			if err != nil {
				return refusal(err)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "request %s (%s), expires %s:\n%s\n", r.ID, r.Op, r.Expires.Format(time.RFC3339), r.Summary)
			if r.Op == ops.KindTerminal {
				fmt.Fprintln(cmd.ErrOrStderr(), "A terminal is this bastion's account: from it the control plane can read the bastion's keys "+
					"and so act as you would here. Approve it only as you would hand over the account.")
			}
			code, err := readCode(stdin, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if err := st.Approve(r.ID, code); err != nil {
				return refusal(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "approved %s: it admits that one request, once\n", r.ID)
			return nil
		},
	}
	dataFlag(c, &dir)
	return c
}

func bastionDenyCmd() *cobra.Command {
	var dir string
	c := &cobra.Command{
		Use:   "deny REQUEST [--data DIR]",
		Short: "Deny one pending request",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := openApprovals(dir)
			if err != nil {
				return err
			}
			if err := st.Deny(args[0]); err != nil {
				return refusal(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "denied %s\n", args[0])
			return nil
		},
	}
	dataFlag(c, &dir)
	return c
}

func bastionShareCmd() *cobra.Command {
	var dir string
	var excludes []string
	c := &cobra.Command{
		Use:   "share PATH [--exclude PATTERN]... [--data DIR]",
		Short: "Share a folder with the pairing: list, stat, read, and move plans you approve; .agent is never served",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := agent.PairedID(dir); err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			s, err := share.Add(dir, args[0], excludes, time.Now())
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "shared %s as %s (excluding %s and .agent)\n", s.Path, s.ID, strings.Join(s.Excludes, ", "))
			return nil
		},
	}
	dataFlag(c, &dir)
	c.Flags().StringArrayVar(&excludes, "exclude", nil, "a name (any depth) or a run of folders such as .config/gcloud (repeatable)")
	return c
}

func bastionSharesCmd() *cobra.Command {
	var dir string
	var asJSON bool
	c := &cobra.Command{
		Use:   "shares [--data DIR] [--json]",
		Short: "List the folders shared with the pairing",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ss, err := share.List(dir)
			if err != nil {
				return err
			}
			if asJSON {
				if ss == nil {
					ss = []share.Share{}
				}
				return printJSON(cmd.OutOrStdout(), map[string]any{"shares": ss})
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tPATH\tEXCLUDES")
			for _, s := range ss {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", s.ID, s.Path, strings.Join(s.Excludes, ","))
			}
			return tw.Flush()
		},
	}
	dataFlag(c, &dir)
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func bastionUnshareCmd() *cobra.Command {
	var dir string
	c := &cobra.Command{
		Use:   "unshare ID [--data DIR]",
		Short: "Stop sharing a folder",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := share.Remove(dir, args[0]); err != nil {
				return refusal(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "unshared %s\n", args[0])
			return nil
		},
	}
	dataFlag(c, &dir)
	return c
}
