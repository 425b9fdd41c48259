package cli

import (
	"fmt"

	"github.com/spf13/cobra"
)

// quotaCommands are `tenants quotas` and `tenants set-quotas`.
func quotaCommands() []*cobra.Command {
	quotaText := func(o map[string]any) string {
		l, _ := o["limits"].(map[string]any)
		if o["exempt"] == true {
			return fmt.Sprintf("%v is not limited (the root tenant)\n", o["tenant_id"])
		}
		return fmt.Sprintf("join_tokens         %v\nsandboxes           %v\nwarm_memory_mb      %v\ncommands_in_flight  %v\n",
			l["join_tokens"], l["sandboxes"], l["warm_memory_mb"], l["commands_in_flight"])
	}
	var gj bool
	get := &cobra.Command{Use: "quotas [ID]", Short: "Show a tenant's quotas (default: your own)", Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := ""
			if len(args) == 1 {
				id = args[0]
			}
			return call(cmd, "tenants.getQuotas", map[string]any{"id": id}, gj, quotaText)
		}}
	get.Flags().BoolVar(&gj, "json", false, "print JSON")
	var sj, reset bool
	var tokens, sandboxes, warmMB, inFlight int64
	set := &cobra.Command{Use: "set-quotas ID [--join-tokens N] [--sandboxes N] [--warm-memory-mb N] [--commands-in-flight N] [--reset]",
		Short: "Set a tenant's quotas (root operators only); unset flags keep the current limit, or with --reset the default",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			limits := map[string]any{}
			for flag, key := range map[string]string{"join-tokens": "join_tokens", "sandboxes": "sandboxes", "warm-memory-mb": "warm_memory_mb", "commands-in-flight": "commands_in_flight"} {
				if cmd.Flags().Changed(flag) {
					v, _ := cmd.Flags().GetInt64(flag)
					limits[key] = v
				}
			}
			return call(cmd, "tenants.setQuotas", map[string]any{"id": args[0], "limits": limits, "reset": reset}, sj, quotaText)
		}}
	f := set.Flags()
	f.Int64Var(&tokens, "join-tokens", 0, "outstanding (unused, unexpired) join tokens")
	f.Int64Var(&sandboxes, "sandboxes", 0, "live sandboxes")
	f.Int64Var(&warmMB, "warm-memory-mb", 0, "warm-pool memory in MiB (sum over templates of warm × memory)")
	f.Int64Var(&inFlight, "commands-in-flight", 0, "queued, sent or running commands")
	f.BoolVar(&reset, "reset", false, "return every limit not given to the default")
	f.BoolVar(&sj, "json", false, "print JSON")
	return []*cobra.Command{get, set}
}
