package bcdcli

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/internal/hostinstall"
)

// installCmds are `bcd install` and `bcd doctor`: set up a node for
// privilege separation, and check one.
func installCmds() []*cobra.Command {
	return []*cobra.Command{installCmd(), doctorCmd()}
}

func installCmd() *cobra.Command {
	var o hostinstall.Options
	var unprivileged, asJSON bool
	c := &cobra.Command{
		Use:   "install --unprivileged",
		Short: "Install bcd node as the unprivileged bcd account with the root helper: account, units, /etc/bcd/helper.toml, directories",
		Long: "Install bcd for privilege separation: the bcd system account (no supplementary group, no shell), bcd.service (User=bcd, " +
			"no capability) and bcd-helper.service (root), /etc/bcd/helper.toml (0640 root:bcd) pinning the command-signing roots, " +
			"/var/lib/bcd (0700 bcd) and /var/lib/bcd-helper (0700 root). With --root DIR everything is written under DIR (tests, " +
			"packaging) and the account goes into DIR/etc/passwd and DIR/etc/group. Running it again changes nothing and says so.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !unprivileged {
				return &ExitError{Code: 2, Err: errors.New("bcd install supports only --unprivileged")}
			}
			if o.Root == "" && os.Geteuid() != 0 {
				return &ExitError{Code: 2, Err: errors.New("bcd install writes / and runs useradd: run it as root, or pass --root DIR")}
			}
			r, err := hostinstall.Install(cmd.Context(), o)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(r)
			}
			out := cmd.OutOrStdout()
			for _, a := range r.Actions {
				fmt.Fprintf(out, "%-9s %s\n", a.Did, a.Path)
			}
			for _, w := range r.Warnings {
				fmt.Fprintln(cmd.ErrOrStderr(), "warning:", w)
			}
			if !r.Changed {
				fmt.Fprintln(out, "no change: already installed")
			} else if o.Root == "" {
				fmt.Fprintln(out, "next: systemctl daemon-reload && systemctl enable --now bcd-helper.service bcd.service")
			}
			return nil
		},
	}
	c.Flags().BoolVar(&unprivileged, "unprivileged", false, "run bcd node as the bcd account, with bcd helper as root (required)")
	c.Flags().StringVar(&o.Root, "root", "", "install under this directory instead of / (tests, packaging)") // archtest:not-tenant (a flag name)
	c.Flags().StringArrayVar(&o.CommandRootSHA256, "command-root-sha256", nil, "SHA-256 (hex) of a command-signing root certificate's DER to pin (repeatable)")
	c.Flags().StringVar(&o.Bin, "bin", "", "a bcd binary to install as /usr/local/bin/bcd and pin in exe_sha256")
	c.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	return c
}

func doctorCmd() *cobra.Command {
	var o hostinstall.DoctorOptions
	var asJSON bool
	c := &cobra.Command{
		Use:   "doctor",
		Short: "Check an unprivileged install: one line per finding, exit 1 if any",
		Long: "Check an installed node: the bcd account and its groups (none root-equivalent), the modes and owners of /etc/bcd, " +
			"helper.toml, /var/lib/bcd and every directory on the way to root's files, the units' hardening lines (drop-ins included), " +
			"pinned command-signing roots, and, on the live system (no --root), the helper's socket and a ping. Each finding starts " +
			"with a stable code (dir-writable, group-root-equivalent, roots-unpinned, ...).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fs := hostinstall.Doctor(cmd.Context(), o)
			out := cmd.OutOrStdout()
			if asJSON {
				if fs == nil {
					fs = []hostinstall.Finding{}
				}
				if err := json.NewEncoder(out).Encode(map[string]any{"findings": fs}); err != nil {
					return err
				}
			} else {
				for _, f := range fs {
					fmt.Fprintln(out, f)
				}
				if len(fs) == 0 {
					fmt.Fprintln(out, "ok: no finding")
				}
			}
			if len(fs) > 0 {
				return &ExitError{Code: 1}
			}
			return nil
		},
	}
	c.Flags().StringVar(&o.Root, "root", "", "check the install under this directory instead of /") // archtest:not-tenant (a flag name)
	c.Flags().BoolVar(&asJSON, "json", false, "print the findings as JSON")
	return c
}
