package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/client"
)

// addLifecycleCommands adds the commands that end what others made, and
// whoami, to the families of root.
func addLifecycleCommands(root *cobra.Command) {
	add := func(family string, cmds ...*cobra.Command) {
		for _, c := range root.Commands() {
			if c.Name() == family {
				c.AddCommand(cmds...)
			}
		}
	}
	add("tenants", tenantsDeleteCmd())
	add("roles", rolesDeleteCmd())
	add("join-tokens", joinTokensListCmd(), joinTokensRevokeCmd())
	add("nodes", nodesShowCmd(), nodesDeleteCmd())
	add("commands", commandsCancelCmd())
	add("templates", templatesUpdateCmd())
	add("images", imagesDeleteCmd())
	root.AddCommand(whoamiCmd())
}

func whoamiCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{Use: "whoami", Short: "Show the identity, tenant and key your credential speaks for", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := apiClient()
			if err != nil {
				return err
			}
			w, err := cl.Whoami(contextOf(cmd))
			if err != nil {
				return apiErr(err)
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), w)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "identity  %s (%s, %s)\ntenant    %s\nkey       %s\n", w.IdentityID, w.IdentityName, w.Kind, w.TenantID, w.KeyID)
			if w.SessionID != "" {
				fmt.Fprintf(out, "session   %s\n", w.SessionID)
			}
			if len(w.Scopes) > 0 {
				fmt.Fprintf(out, "scopes    %s\n", strings.Join(w.Scopes, ", "))
			}
			if w.ExpiresAt != nil {
				fmt.Fprintf(out, "expires   %s\n", w.ExpiresAt.Format(time.RFC3339))
			}
			return nil
		}}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func tenantsDeleteCmd() *cobra.Command {
	var yes, asJSON bool
	c := &cobra.Command{Use: "delete ID",
		Short: "Delete a tenant and every tenant below it: their sandboxes and warm pools go, their nodes' certificates, join tokens, keys and sessions are revoked",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := apiClient()
			if err != nil {
				return err
			}
			if err := resolveArg(cmd, cl, "tenant", &args[0]); err != nil {
				return err
			}
			if !yes {
				if err := confirmTenantDelete(cmd, cl, args[0]); err != nil {
					return err
				}
			}
			out, err := cl.DeleteTenant(contextOf(cmd), args[0])
			if err != nil {
				return apiErr(err)
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), out)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s deleted: %d tenant(s), %d sandbox(es), %d template(s), %d node certificate(s), %d join token(s), %d key(s), %d session(s)\n",
				out.ID, out.TenantsDeleted, out.SandboxesDeleted, out.TemplatesDeleted, out.CertificatesRevoked, out.JoinTokensRevoked, out.KeysRevoked, out.SessionsRevoked)
			return nil
		}}
	c.Flags().BoolVar(&yes, "yes", false, "delete without asking (for scripts; required when standard input is not a terminal)")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// confirmTenantDelete shows what deleting tenant id ends and asks on the
// terminal (confirmOrYes: without a terminal it refuses, exit 2, naming
// --yes).
func confirmTenantDelete(cmd *cobra.Command, cl *client.Client, id string) error {
	if !stdinIsTerminal() {
		return confirmOrYes(cmd, false, "")
	}
	var tree struct {
		Tenants []client.Tenant `json:"tenants"`
	}
	if err := cl.Call(contextOf(cmd), "tenants.list", map[string]any{"tenant_id": id}, &tree); err != nil {
		return apiErr(err)
	}
	return confirmOrYes(cmd, false, fmt.Sprintf("Delete tenant %s and the %d tenant(s) below it? Their sandboxes and warm pools are deleted, and their nodes' certificates, join tokens, API keys and sessions revoked; this cannot be undone.", id, max(len(tree.Tenants)-1, 0)))
}

func rolesDeleteCmd() *cobra.Command {
	var tenant string
	c := &cobra.Command{Use: "delete ID", Short: "Delete a role and every binding of it (built-in roles cannot be deleted)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, "roles.delete", map[string]any{"tenant_id": tenant, "id": args[0]}, false,
				func(o map[string]any) string {
					return fmt.Sprintf("deleted (%v binding(s) removed)\n", o["bindings_deleted"])
				})
		}}
	c.Flags().StringVar(&tenant, "tenant", "", "tenant (default: your own)")
	return c
}

func joinTokensListCmd() *cobra.Command {
	var tenant string
	var asJSON bool
	c := &cobra.Command{Use: "list", Short: "List join tokens (never their secrets), newest first, with their state", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, "joinTokens.list", map[string]any{"tenant_id": tenant}, asJSON,
				table("join_tokens", "id", "name", "role", "state", "expires_at", "node_id"))
		}}
	c.Flags().StringVar(&tenant, "tenant", "", "tenant (default: your own)")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func joinTokensRevokeCmd() *cobra.Command {
	var tenant string
	c := &cobra.Command{Use: "revoke ID", Short: "Revoke an unused join token: no node can join with it", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, "joinTokens.revoke", map[string]any{"tenant_id": tenant, "id": args[0]}, false,
				func(map[string]any) string { return "revoked\n" })
		}}
	c.Flags().StringVar(&tenant, "tenant", "", "tenant (default: your own)")
	return c
}

func nodesShowCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{Use: "show ID", Short: "Show a node", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := apiClient()
			if err != nil {
				return err
			}
			if err := resolveArg(cmd, cl, "node", &args[0]); err != nil {
				return err
			}
			n, err := cl.Node(contextOf(cmd), args[0])
			if err != nil {
				return apiErr(err)
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), n)
			}
			state := n.State
			if n.StateReason != "" {
				state += " (" + n.StateReason + ")"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "id         %s\nname       %s\ntenant     %s\nrole       %s\nstate      %s\nconnected  %v\n",
				n.ID, n.Name, n.TenantID, n.Role, state, n.Connected)
			return nil
		}}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func commandsCancelCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{Use: "cancel ID", Short: "Cancel a queued command before any node has it", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, "commands.cancel", map[string]any{"id": args[0]}, asJSON,
				func(o map[string]any) string { return fmt.Sprintf("%v %v\n", o["id"], o["state"]) })
		}}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func nodesDeleteCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{Use: "delete ID", Short: "Delete a node for good: its certificates are revoked and it leaves every listing (the machine comes back only by joining anew)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, "nodes.delete", map[string]any{"id": args[0]}, asJSON,
				func(o map[string]any) string {
					return fmt.Sprintf("deleted; %v certificate(s) revoked\n", o["certificates_revoked"])
				})
		}}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}
