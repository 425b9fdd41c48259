package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// approvalsCmd is `better-compute approvals`: the requests of agents
// acting for the caller that wait for its confirmation, and the command
// kinds a tenant holds back. Only the person an agent acts for may
// approve or deny its requests; an approval admits the one call whose
// text it shows.
func approvalsCmd() *cobra.Command {
	c := &cobra.Command{Use: "approvals", Short: "Requests of your agents that wait for your confirmation"}
	var tenant string
	var asJSON bool
	list := &cobra.Command{Use: "list", Short: "List the requests waiting for you, with the text each was described by", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, "approvals.list", map[string]any{"tenant_id": tenant}, asJSON, approvalsText)
		}}
	list.Flags().StringVar(&tenant, "tenant", "", "tenant (default: your own)")
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.AddCommand(list, decideApprovalCmd("approve", "approvals.approve", "Approve a request: the agent's same call then goes through once"),
		decideApprovalCmd("deny", "approvals.deny", "Deny a request"), approvalKindsCmd())
	return c
}

// approvalsText prints each request: its id, method, expiry and the text.
func approvalsText(out map[string]any) string {
	rows, _ := out["approvals"].([]any)
	if len(rows) == 0 {
		return "no request waits for you\n"
	}
	var b strings.Builder
	for _, r := range rows {
		m, _ := r.(map[string]any)
		fmt.Fprintf(&b, "%v  %v  expires %v\n", m["id"], m["method"], cellText("expires_at", m["expires_at"]))
		text, _ := m["text"].(string)
		for _, line := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
			fmt.Fprintf(&b, "    %s\n", line)
		}
		fmt.Fprintf(&b, "    digest: sha256 %v\n", m["digest"])
	}
	return b.String()
}

// decideApprovalCmd is `approvals approve ID` or `approvals deny ID`.
func decideApprovalCmd(verb, method, short string) *cobra.Command {
	var tenant string
	var asJSON bool
	c := &cobra.Command{Use: verb + " ID", Short: short, Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, method, map[string]any{"tenant_id": tenant, "id": args[0]}, asJSON, func(o map[string]any) string {
				return fmt.Sprintf("%v %v (sha256 %v), open until %v\n", o["id"], o["state"], o["digest"], cellText("expires_at", o["expires_at"]))
			})
		}}
	c.Flags().StringVar(&tenant, "tenant", "", "tenant (default: your own)")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// approvalKindsCmd is `approvals kinds [--set KIND,...]`: the command
// kinds whose commands.create and commands.fanout by an agent wait for
// its person.
func approvalKindsCmd() *cobra.Command {
	var tenant string
	var set []string
	var clear, asJSON bool
	c := &cobra.Command{Use: "kinds", Short: "Show (or --set, --clear) the command kinds an agent's commands wait for its person on", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			text := func(o map[string]any) string {
				ks, _ := o["kinds"].([]any)
				if len(ks) == 0 {
					return "no command kind is held back\n"
				}
				var b strings.Builder
				for _, k := range ks {
					fmt.Fprintf(&b, "%v\n", k)
				}
				return b.String()
			}
			if len(set) == 0 && !clear {
				return call(cmd, "approvals.getKinds", map[string]any{"tenant_id": tenant}, asJSON, text)
			}
			return call(cmd, "approvals.setKinds", map[string]any{"tenant_id": tenant, "kinds": append([]string{}, set...)}, asJSON, text)
		}}
	c.Flags().StringVar(&tenant, "tenant", "", "tenant (default: your own)")
	c.Flags().StringSliceVar(&set, "set", nil, "hold back these kinds (replacing the list)")
	c.Flags().BoolVar(&clear, "clear", false, "hold back no kind")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// delegationCmd is `identities delegation`: the agents that act for
// persons, and revoking one (the agent is then refused everything).
func delegationCmd() *cobra.Command {
	c := &cobra.Command{Use: "delegation", Short: "Agents acting for persons"}
	var lt string
	var lj bool
	list := &cobra.Command{Use: "list", Short: "List the tenant's delegations", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, "delegations.list", map[string]any{"tenant_id": lt}, lj,
				table("delegations", "agent_id", "agent_name", "person_id", "person_name", "created_at", "revoked_at"))
		}}
	list.Flags().StringVar(&lt, "tenant", "", "tenant (default: your own)")
	list.Flags().BoolVar(&lj, "json", false, "print JSON")
	var rt string
	revoke := &cobra.Command{Use: "revoke AGENT_ID", Short: "Revoke an agent's delegation: it is refused every call from then on", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, "delegations.revoke", map[string]any{"tenant_id": rt, "id": args[0]}, false, func(map[string]any) string { return "revoked\n" })
		}}
	revoke.Flags().StringVar(&rt, "tenant", "", "tenant (default: your own)")
	c.AddCommand(list, revoke)
	return c
}

// suspendCmd is `identities suspend ID` or `identities resume ID`.
func suspendCmd(verb, method, short string) *cobra.Command {
	var tenant string
	c := &cobra.Command{Use: verb + " ID", Short: short, Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, method, map[string]any{"tenant_id": tenant, "id": args[0]}, false, func(map[string]any) string { return verb + "d\n" })
		}}
	c.Flags().StringVar(&tenant, "tenant", "", "tenant (default: your own)")
	return c
}
