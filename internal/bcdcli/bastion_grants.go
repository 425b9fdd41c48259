package bcdcli

import (
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/internal/bastion/approval"
	"github.com/bettercompute/bettercompute/internal/bastion/ops"
)

// bastionStandingCmd is `bcd bastion ops`: standing grants, held on this
// machine to their window and rate.
func bastionStandingCmd(stdin io.Reader) *cobra.Command {
	c := &cobra.Command{Use: "ops", Short: "Standing grants: op kinds you approved for later, held here to a window and a rate"}
	c.AddCommand(standingGrantCmd(stdin), standingListCmd(), standingDropCmd())
	return c
}

func standingGrantCmd(stdin io.Reader) *cobra.Command {
	var dir, kind, notBefore, notAfter string
	var perHour, perDay int
	c := &cobra.Command{
		Use:   "grant --kind K --not-after T [--not-before T] --per-hour N --per-day N [--data DIR]",
		Short: "Approve an op kind for later with a code: at most 30 days, at most N runs an hour and M a day",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !ops.StandingKinds[kind] {
				return &ExitError{Code: 2, Err: fmt.Errorf("--kind: a standing grant is for %s or %s only", ops.KindFilesMove, ops.KindDryRun)}
			}
			now := time.Now()
			nb := now
			var err error
			if notBefore != "" {
				if nb, err = parseWhen(notBefore, now); err != nil {
					return err
				}
			}
			na, err := parseWhen(notAfter, now)
			if err != nil {
				return err
			}
			st, err := openApprovals(dir)
			if err != nil {
				return err
			}
			code, err := readCode(stdin, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			g, err := st.GrantStanding(kind, nb, na, perHour, perDay, code)
			if err != nil {
				return refusal(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "standing grant %s: %s from %s to %s, %d an hour, %d a day\n", g.ID, g.Kind,
				g.NotBefore.Format(time.RFC3339), g.NotAfter.Format(time.RFC3339), g.PerHour, g.PerDay)
			return nil
		},
	}
	dataFlag(c, &dir)
	c.Flags().StringVar(&kind, "kind", "", "the op kind: files:move-plan or action:dry-run")
	c.Flags().StringVar(&notBefore, "not-before", "", "start (RFC 3339 or a duration from now; default now)")
	c.Flags().StringVar(&notAfter, "not-after", "24h", "end (RFC 3339 or a duration from now; at most 30 days after the start)")
	c.Flags().IntVar(&perHour, "per-hour", 1, "runs an hour")
	c.Flags().IntVar(&perDay, "per-day", 10, "runs a day")
	return c
}

func standingListCmd() *cobra.Command {
	var dir string
	var asJSON bool
	c := &cobra.Command{
		Use:   "list [--data DIR] [--json]",
		Short: "List the standing grants; a record that does not open holds no grant and is shown as invalid",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := openApprovals(dir)
			if err != nil {
				return err
			}
			gs, err := st.ListStanding()
			if err != nil {
				return err
			}
			if asJSON {
				if gs == nil {
					gs = []approval.Standing{}
				}
				return printJSON(cmd.OutOrStdout(), map[string]any{"grants": gs})
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tKIND\tNOT BEFORE\tNOT AFTER\tPER HOUR\tPER DAY\tRUNS\tVALID")
			for _, g := range gs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%v\n", g.ID, g.Kind, g.NotBefore.Format(time.RFC3339),
					g.NotAfter.Format(time.RFC3339), g.PerHour, g.PerDay, len(g.Runs), g.Valid)
			}
			return tw.Flush()
		},
	}
	dataFlag(c, &dir)
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func standingDropCmd() *cobra.Command {
	var dir string
	var all bool
	c := &cobra.Command{
		Use:   "drop (ID | --all) [--data DIR]",
		Short: "Take back a standing grant, or every one",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) == 1) {
				return &ExitError{Code: 2, Err: errors.New("give one grant ID or --all")}
			}
			st, err := openApprovals(dir)
			if err != nil {
				return err
			}
			if all {
				n, err := st.DropAllStanding()
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "dropped %d standing grants\n", n)
				return nil
			}
			if err := st.DropStanding(args[0]); err != nil {
				return refusal(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "dropped %s\n", args[0])
			return nil
		},
	}
	dataFlag(c, &dir)
	c.Flags().BoolVar(&all, "all", false, "drop every standing grant")
	return c
}

func bastionRootGrantCmd(stdin io.Reader) *cobra.Command {
	var dir, until string
	var revoke bool
	c := &cobra.Command{
		Use:   "root-grant (--until T | --revoke) [--data DIR]",
		Short: "Let the control plane run commands as root until T (root and a code); --revoke ends it and stops running commands",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := needRoot("root-grant", dir); err != nil {
				return err
			}
			st, err := openApprovals(dir)
			if err != nil {
				return err
			}
			if revoke {
				if err := st.RevokeRootGrant(); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), "root command grant revoked: running root commands stop within 2 seconds")
				return nil
			}
			t, err := parseWhen(until, time.Now())
			if err != nil {
				return err
			}
			code, err := readCode(stdin, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if err := st.GiveRootGrant(t, code); err != nil {
				return refusal(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "root commands allowed until %s\n", t.Format(time.RFC3339))
			return nil
		},
	}
	dataFlag(c, &dir)
	c.Flags().StringVar(&until, "until", "1h", "end (RFC 3339 or a duration from now)")
	c.Flags().BoolVar(&revoke, "revoke", false, "end the grant now")
	return c
}

func bastionAnchorCmd(stdin io.Reader) *cobra.Command {
	var dir string
	var remove bool
	c := &cobra.Command{
		Use:   "anchor [--remove] [--data DIR]",
		Short: "Mark this machine as one a fleet owns (root); --remove needs root and a code",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := needRoot("anchor", dir); err != nil {
				return err
			}
			st, err := openApprovals(dir)
			if err != nil {
				return err
			}
			if !remove {
				if err := st.Anchor(); err != nil {
					return refusal(err)
				}
				fmt.Fprintln(cmd.OutOrStdout(), "anchored: every write needs an approval here; action ops may reach private destinations")
				return nil
			}
			code, err := readCode(stdin, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if err := st.Unanchor(code); err != nil {
				return refusal(err)
			}
			fmt.Fprintln(cmd.OutOrStdout(), "no longer anchored")
			return nil
		},
	}
	dataFlag(c, &dir)
	c.Flags().BoolVar(&remove, "remove", false, "un-anchor (needs a code)")
	return c
}
