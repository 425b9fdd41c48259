package cli

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
)

// bastionsCmd is `better-compute bastions`: pairing, grants and unpairing
// of bastions (a person's own machine running bcd bastion). `bastions
// connect`, `bastions op` and `bastions terminal` reach a bastion through
// the lanes role's tunnel.
func bastionsCmd() *cobra.Command {
	c := &cobra.Command{Use: "bastions", Short: "Bastions: people's own machines that dial out and serve gated lanes"}
	c.AddCommand(bastionsPairTokenCmd(), bastionsListCmd(), bastionsShowCmd(), bastionsGrantCmd(), bastionsGrantsCmd(), bastionsConnectCmd(),
		bastionsRevokeGrantCmd(), bastionsUnpairCmd(), bastionsOpCmd(), bastionsTerminalCmd())
	return c
}

// bastionsPairTokenCmd writes a one-time pairing token to a new 0600 file;
// the token is never printed.
func bastionsPairTokenCmd() *cobra.Command {
	var name, out string
	var ttl time.Duration
	var asJSON, force bool
	pt := &cobra.Command{
		Use:   "pair-token --name NAME --out FILE",
		Short: "Make a one-time pairing token for a bastion, written to a new 0600 file (never printed)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if name == "" || out == "" {
				return &ExitError{Code: 2, Err: errors.New("--name and --out are required (the token is written only to a file)")}
			}
			cl, err := apiClient()
			if err != nil {
				return err
			}
			of, err := openOut(out, force, secretFileMode)
			if err != nil {
				return err
			}
			t, err := cl.PairBastion(contextOf(cmd), name, ttl)
			if err != nil {
				of.Abort()
				return apiErr(err)
			}
			if err := of.Commit([]byte(t.Token + "\n")); err != nil {
				return err
			}
			t.Token = ""
			if asJSON {
				return printJSON(cmd.OutOrStdout(), map[string]any{"token_id": t.TokenID, "expires_at": t.ExpiresAt, "file": out})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "pairing token %s written to %s (0600), expires %s\n", t.TokenID, out, timeText(t.ExpiresAt))
			fmt.Fprintln(cmd.ErrOrStderr(), "give it to bcd bastion pair through BCD_PAIR_TOKEN or standard input")
			return nil
		},
	}
	pt.Flags().StringVar(&name, "name", "", "the bastion's name")
	pt.Flags().StringVar(&out, "out", "", "write the token to this new 0600 file")
	pt.Flags().DurationVar(&ttl, "ttl", time.Hour, "how long the token is valid (at most 168h)")
	forceFlag(pt, &force)
	pt.Flags().BoolVar(&asJSON, "json", false, "print JSON (never the token)")
	return pt
}

func bastionsListCmd() *cobra.Command {
	var tenant string
	var asJSON bool
	list := &cobra.Command{Use: "list", Short: "List bastions: connected, and the families their live grants allow", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, "bastions.list", map[string]any{"tenant_id": tenant}, asJSON, table("bastions", "id", "name", "connected", "families"))
		}}
	list.Flags().StringVar(&tenant, "tenant", "", "tenant (default: your own)")
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return list
}

func bastionsShowCmd() *cobra.Command {
	var asJSON bool
	show := &cobra.Command{Use: "show ID", Short: "Show a bastion: state, tunnel address, key fingerprint, grants", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, "bastions.get", map[string]any{"id": args[0]}, asJSON, func(o map[string]any) string {
				var b strings.Builder
				for _, k := range []string{"id", "name", "tenant_id", "state", "connected", "families", "tunnel_addr", "wg_key_fingerprint", "grants", "created_at", "unpaired_at"} {
					if v, ok := o[k]; ok && v != nil {
						fmt.Fprintf(&b, "%-19s %s\n", k, cellText(k, v))
					}
				}
				return b.String()
			})
		}}
	show.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return show
}

func bastionsGrantCmd() *cobra.Command {
	var in apitypes.BastionGrantIn
	var ttl time.Duration
	var asJSON bool
	g := &cobra.Command{
		Use:   "grant --bastion ID --allow FAMILY… [--deny FAMILY…] [--model M…] [--reach SERVER…] [--ttl D]",
		Short: "Sign a grant for a bastion: families inference, models, services, egress (a deny in any grant beats every allow)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if in.BastionID == "" || len(in.Allow) == 0 && len(in.Deny) == 0 {
				return &ExitError{Code: 2, Err: errors.New("--bastion and at least one --allow or --deny are required")}
			}
			in.TTLSeconds = int64(ttl / time.Second)
			return call(cmd, "bastions.grant", in, asJSON, func(o map[string]any) string {
				return fmt.Sprintf("%v expires %v\n", o["id"], cellText("expires_at", o["expires_at"]))
			})
		},
	}
	g.Flags().StringVar(&in.BastionID, "bastion", "", "the bastion's id")
	g.Flags().StringSliceVar(&in.Allow, "allow", nil, "a family to allow (repeatable)")
	g.Flags().StringSliceVar(&in.Deny, "deny", nil, "a family to deny (repeatable; beats any allow)")
	g.Flags().StringSliceVar(&in.Models, "model", nil, "a model in scope, such as llama3:8b (repeatable)")
	g.Flags().StringSliceVar(&in.Reach, "reach", nil, "a service-slot server the grant reaches (repeatable)")
	g.Flags().DurationVar(&ttl, "ttl", 24*time.Hour, "how long the grant holds (at most 720h)")
	g.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return g
}

func bastionsGrantsCmd() *cobra.Command {
	var bastion string
	var asJSON bool
	gs := &cobra.Command{Use: "grants --bastion ID", Short: "List a bastion's grants, newest first (revoked and expired ones flagged)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if bastion == "" {
				return &ExitError{Code: 2, Err: errors.New("--bastion is required")}
			}
			return call(cmd, "bastions.grants", map[string]any{"bastion_id": bastion}, asJSON,
				table("grants", "id", "allow", "deny", "models", "reach", "expires_at", "revoked", "expired"))
		}}
	gs.Flags().StringVar(&bastion, "bastion", "", "the bastion's id")
	gs.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return gs
}

func bastionsRevokeGrantCmd() *cobra.Command {
	return &cobra.Command{Use: "revoke-grant GRANT_ID", Short: "Revoke a grant (the bastion drops it at once while connected)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, "bastions.revokeGrant", map[string]any{"id": args[0]}, false, func(map[string]any) string { return "revoked\n" })
		}}
}

func bastionsUnpairCmd() *cobra.Command {
	var yes bool
	u := &cobra.Command{Use: "unpair ID", Short: "Unpair a bastion for good: its certificates are revoked and its tunnel goes down", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := confirmOrYes(cmd, yes, "unpair bastion "+args[0]+" for good?"); err != nil {
				return err
			}
			return call(cmd, "bastions.unpair", map[string]any{"id": args[0]}, false, func(map[string]any) string { return "unpaired\n" })
		}}
	u.Flags().BoolVar(&yes, "yes", false, "do not ask")
	return u
}
