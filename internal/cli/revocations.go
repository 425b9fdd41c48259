package cli

import (
	"github.com/spf13/cobra"
)

// revocationsCmd is `revocations list [--since SEQ] [--json]`: the
// revocation feed as the caller's tenant sees it (every entry for root).
func revocationsCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "revocations", Short: "The revocation feed: every revoked certificate, key, session, identity and ticket, in order"}
	var since int64
	var limit int
	var asJSON bool
	list := &cobra.Command{Use: "list [--since SEQ] [--limit N] [--json]", Short: "List the feed's entries after SEQ (default: from the start)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return call(cmd, "revocations.list", map[string]any{"since": since, "limit": limit}, asJSON,
				table("revocations", "seq", "kind", "subject", "tenant_id", "node_id", "at", "reason", "signed"))
		}}
	f := list.Flags()
	f.Int64Var(&since, "since", 0, "list the entries after this sequence number")
	f.IntVar(&limit, "limit", 100, "at most this many entries (up to 1000)")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	cmd.AddCommand(list)
	return cmd
}
