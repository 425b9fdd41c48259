package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// call runs one API method and prints its answer as JSON (--json) or
// through text.
func call(cmd *cobra.Command, method string, in any, asJSON bool, text func(map[string]any) string) error {
	cl, err := apiClient()
	if err != nil {
		return err
	}
	if in, err = resolveInput(contextOf(cmd), cl, method, in); err != nil {
		return err
	}
	var out map[string]any
	if err := cl.Call(contextOf(cmd), method, in, &out); err != nil {
		return apiErr(err)
	}
	if asJSON || text == nil {
		return printJSON(cmd.OutOrStdout(), out)
	}
	_, err = fmt.Fprint(cmd.OutOrStdout(), text(out))
	return err
}

// table renders rows of a list answer.
func table(key string, cols ...string) func(map[string]any) string {
	return func(out map[string]any) string {
		var b tabwriterBuf
		tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		for i, c := range cols {
			if i > 0 {
				fmt.Fprint(tw, "\t")
			}
			fmt.Fprint(tw, c)
		}
		fmt.Fprintln(tw)
		rows, _ := out[key].([]any)
		for _, r := range rows {
			m, _ := r.(map[string]any)
			for i, c := range cols {
				if i > 0 {
					fmt.Fprint(tw, "\t")
				}
				if v, ok := m[c]; ok && v != nil {
					fmt.Fprint(tw, cellText(c, v))
				} else {
					fmt.Fprint(tw, "-")
				}
			}
			fmt.Fprintln(tw)
		}
		tw.Flush()
		return string(b)
	}
}

type tabwriterBuf []byte

func (b *tabwriterBuf) Write(p []byte) (int, error) { *b = append(*b, p...); return len(p), nil }

func tenantsCmd() *cobra.Command {
	c := &cobra.Command{Use: "tenants", Short: "Tenants: a tree under the root tenant"}
	var parent string
	var asJSON bool
	create := &cobra.Command{Use: "create NAME", Short: "Make a tenant", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, "tenants.create", map[string]any{"parent_id": parent, "name": args[0]}, asJSON,
				func(o map[string]any) string { return fmt.Sprintf("%v\n", o["id"]) })
		}}
	create.Flags().StringVar(&parent, "parent", "", "parent tenant (default: your own)")
	create.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	var listJSON bool
	var under string
	list := &cobra.Command{Use: "list", Short: "List your tenant and those below it", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, "tenants.list", map[string]any{"tenant_id": under}, listJSON, table("tenants", "id", "name", "parent_id", "state"))
		}}
	list.Flags().StringVar(&under, "tenant", "", "list below this tenant")
	list.Flags().BoolVar(&listJSON, "json", false, "print JSON")
	c.AddCommand(create, list)
	c.AddCommand(quotaCommands()...)
	for _, verb := range []string{"suspend", "resume"} { // delete: tenantsDeleteCmd
		var j bool
		sc := &cobra.Command{Use: verb + " ID", Short: verb + " a tenant", Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				return call(cmd, "tenants."+verb, map[string]any{"id": args[0]}, j,
					func(o map[string]any) string { return fmt.Sprintf("%v %v\n", o["id"], o["state"]) })
			}}
		sc.Flags().BoolVar(&j, "json", false, "print JSON")
		c.AddCommand(sc)
	}
	return c
}

func identitiesCmd() *cobra.Command {
	c := &cobra.Command{Use: "identities", Short: "People and agents"}
	var tenant, kind, forPerson string
	var asJSON bool
	create := &cobra.Command{Use: "create NAME", Short: "Make an identity (--kind agent --for PERSON_ID: an agent acting for a person)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in := map[string]any{"tenant_id": tenant, "name": args[0], "kind": kind}
			if forPerson != "" {
				in["for"] = forPerson
			}
			return call(cmd, "identities.create", in, asJSON,
				func(o map[string]any) string { return fmt.Sprintf("%v\n", o["id"]) })
		}}
	create.Flags().StringVar(&tenant, "tenant", "", "tenant (default: your own)")
	create.Flags().StringVar(&kind, "kind", "person", "person or agent")
	create.Flags().StringVar(&forPerson, "for", "", "with --kind agent: the person (identity id, same tenant) the agent acts for; its permissions are at most the person's, and its risky calls wait for the person's approval")
	create.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	var lt string
	var lj bool
	list := &cobra.Command{Use: "list", Short: "List identities", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, "identities.list", map[string]any{"tenant_id": lt}, lj, table("identities", "id", "name", "kind", "tenant_id"))
		}}
	list.Flags().StringVar(&lt, "tenant", "", "tenant (default: your own)")
	list.Flags().BoolVar(&lj, "json", false, "print JSON")
	var dt string
	del := &cobra.Command{Use: "delete ID", Short: "Delete an identity: its bindings go, its keys and sessions are revoked", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, "identities.delete", map[string]any{"tenant_id": dt, "id": args[0]}, false, func(map[string]any) string { return "deleted\n" })
		}}
	del.Flags().StringVar(&dt, "tenant", "", "tenant (default: your own)")
	c.AddCommand(create, list, del, delegationCmd(), suspendCmd("suspend", "identities.suspend", "Suspend an identity: it is refused every call (an agent's person: its agents too) until resumed"),
		suspendCmd("resume", "identities.resume", "Resume a suspended identity"))
	return c
}

func rolesCmd() *cobra.Command {
	c := &cobra.Command{Use: "roles", Short: "Roles: allow and deny statements (a deny always wins)"}
	var tenant, statements string
	var asJSON bool
	create := &cobra.Command{Use: "create NAME --statements JSON", Short: "Make a role", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var st []map[string]any
			if err := json.Unmarshal([]byte(statements), &st); err != nil {
				return &ExitError{Code: 2, Err: errors.New(`--statements must be a JSON array such as [{"effect":"allow","actions":["compute:nodes:*"],"resources":["*"]}]`)}
			}
			return call(cmd, "roles.create", map[string]any{"tenant_id": tenant, "name": args[0], "statements": st}, asJSON,
				func(o map[string]any) string { return fmt.Sprintf("%v\n", o["id"]) })
		}}
	create.Flags().StringVar(&tenant, "tenant", "", "tenant (default: your own)")
	create.Flags().StringVar(&statements, "statements", "", "JSON array of statements")
	create.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	var lt string
	var lj bool
	list := &cobra.Command{Use: "list", Short: "List the roles usable in a tenant", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, "roles.list", map[string]any{"tenant_id": lt}, lj, table("roles", "id", "name", "tenant_id"))
		}}
	list.Flags().StringVar(&lt, "tenant", "", "tenant (default: your own)")
	list.Flags().BoolVar(&lj, "json", false, "print JSON")
	c.AddCommand(create, list)
	return c
}

func bindingsCmd() *cobra.Command {
	c := &cobra.Command{Use: "bindings", Short: "Give identities roles in a tenant and below"}
	var tenant, identity, role string
	var asJSON bool
	create := &cobra.Command{Use: "create --identity ID --role ID", Short: "Bind a role", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, "bindings.create", map[string]any{"tenant_id": tenant, "identity_id": identity, "role_id": role}, asJSON,
				func(o map[string]any) string { return fmt.Sprintf("%v\n", o["id"]) })
		}}
	create.Flags().StringVar(&tenant, "tenant", "", "tenant (default: your own)")
	create.Flags().StringVar(&identity, "identity", "", "identity id")
	create.Flags().StringVar(&role, "role", "", "role id (built in: admin, operator, viewer)")
	create.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	var dt string
	del := &cobra.Command{Use: "delete ID", Short: "Remove a binding", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, "bindings.delete", map[string]any{"tenant_id": dt, "id": args[0]}, false, func(map[string]any) string { return "deleted\n" })
		}}
	del.Flags().StringVar(&dt, "tenant", "", "tenant (default: your own)")
	var lt string
	var lj bool
	list := &cobra.Command{Use: "list", Short: "List the bindings made in a tenant and every tenant below it", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, "bindings.list", map[string]any{"tenant_id": lt}, lj,
				table("bindings", "id", "tenant_id", "identity_id", "identity_name", "identity_tenant_id", "role_id", "role_name"))
		}}
	list.Flags().StringVar(&lt, "tenant", "", "tenant (default: your own)")
	list.Flags().BoolVar(&lj, "json", false, "print JSON")
	c.AddCommand(create, del, list)
	return c
}

func apiKeysCmd() *cobra.Command {
	c := &cobra.Command{Use: "api-keys", Short: "API keys (shown once, stored only as a hash)"}
	var tenant, identity, name, out string
	var ttl time.Duration
	var scopes []string
	var asJSON, force bool
	create := &cobra.Command{Use: "create --identity ID", Short: "Make an API key", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if identity == "" {
				return &ExitError{Code: 2, Err: errors.New("--identity is required")}
			}
			cl, err := apiClient()
			if err != nil {
				return err
			}
			var of *outFile
			if out != "" {
				if of, err = openOut(out, force, secretFileMode); err != nil {
					return err
				}
			}
			k, err := cl.CreateAPIKey(contextOf(cmd), tenant, identity, name, ttl, scopes...)
			if err != nil {
				if of != nil {
					of.Abort()
				}
				return apiErr(err)
			}
			if of != nil {
				if err := of.Commit([]byte(k.Key + "\n")); err != nil {
					return err
				}
				k.Key = ""
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), k)
			}
			if out != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "key %s written to %s (0600)\n", k.ID, out)
				return nil
			}
			fmt.Fprintln(cmd.OutOrStdout(), k.Key)
			fmt.Fprintf(cmd.ErrOrStderr(), "key %s: shown once; keep it in a 0600 file and point BC_API_KEY_FILE at it\n", k.ID)
			return nil
		}}
	create.Flags().StringVar(&tenant, "tenant", "", "tenant (default: your own)")
	create.Flags().StringVar(&identity, "identity", "", "identity id the key speaks for")
	create.Flags().StringVar(&name, "name", "", "a name for the key")
	create.Flags().DurationVar(&ttl, "ttl", 0, "lifetime (0: no expiry)")
	create.Flags().StringSliceVar(&scopes, "scope", nil, "limit the key to these action patterns (repeatable)")
	create.Flags().StringVar(&out, "out", "", "write the key to this new 0600 file instead of printing it")
	forceFlag(create, &force)
	create.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	var lt string
	var lj bool
	list := &cobra.Command{Use: "list", Short: "List API keys (metadata only)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, "apiKeys.list", map[string]any{"tenant_id": lt}, lj, table("api_keys", "id", "name", "identity_id", "created_at", "revoked_at"))
		}}
	list.Flags().StringVar(&lt, "tenant", "", "tenant (default: your own)")
	list.Flags().BoolVar(&lj, "json", false, "print JSON")
	revoke := &cobra.Command{Use: "revoke ID", Short: "Revoke an API key", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, "apiKeys.revoke", map[string]any{"id": args[0]}, false, func(map[string]any) string { return "revoked\n" })
		}}
	c.AddCommand(create, list, revoke)
	return c
}

func sessionsCmd() *cobra.Command {
	c := &cobra.Command{Use: "sessions", Short: "Browser sessions (never outlive the key that made them)"}
	var tenant string
	revoke := &cobra.Command{Use: "revoke ID", Short: "Revoke a session and every session made from it", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, "sessions.revoke", map[string]any{"tenant_id": tenant, "id": args[0]}, false, func(map[string]any) string { return "revoked\n" })
		}}
	revoke.Flags().StringVar(&tenant, "tenant", "", "tenant (default: your own)")
	c.AddCommand(revoke)
	return c
}
