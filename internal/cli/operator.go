package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/pki"
)

func nodesCmd() *cobra.Command {
	c := &cobra.Command{Use: "nodes", Short: "Nodes of the fleet"}
	var asJSON bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List nodes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := apiClient()
			if err != nil {
				return err
			}
			ns, err := cl.Nodes(contextOf(cmd))
			if err != nil {
				return apiErr(err)
			}
			if asJSON {
				if ns == nil {
					ns = []client.Node{}
				}
				return printJSON(cmd.OutOrStdout(), map[string]any{"nodes": ns})
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tROLE\tSTATE\tCONNECTED\tLAST SEEN\tVERSION")
			for _, n := range ns {
				state := n.State
				if n.StateReason != "" {
					state += " (" + n.StateReason + ")"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%v\t%s\t%s\n", n.ID, n.Name, n.Role, state, n.Connected, lastSeenCell(n.LastSeenAt), nodeVersionCell(n.Version))
			}
			return tw.Flush()
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON: {\"nodes\": [...]}")
	var serial string
	revoke := &cobra.Command{
		Use:   "revoke NODE_ID",
		Short: "Revoke a node's certificates (or one, with --serial); its sessions close on every gateway",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := apiClient()
			if err != nil {
				return err
			}
			if err := resolveArg(cmd, cl, "node", &args[0]); err != nil {
				return err
			}
			var out struct {
				Revoked int `json:"revoked"`
			}
			if err := cl.Call(contextOf(cmd), "nodes.revoke", map[string]any{"node_id": args[0], "serial": serial}, &out); err != nil {
				return apiErr(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "revoked %d certificate(s)\n", out.Revoked)
			return nil
		},
	}
	revoke.Flags().StringVar(&serial, "serial", "", "revoke only this certificate serial")
	c.AddCommand(list, revoke)
	return c
}

func joinTokensCmd() *cobra.Command {
	c := &cobra.Command{Use: "join-tokens", Short: "One-time tokens that let a node join"}
	var role, name, out string
	var ttl time.Duration
	var asJSON, force bool
	create := &cobra.Command{
		Use:   "create",
		Short: "Make a single-use join token (shown once; stored only as a hash)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if role == pki.RoleBastion {
				return &ExitError{Code: 2, Err: errors.New("--role bastion: a bastion's pairing token is made by `better-compute bastions pair-token`")}
			}
			if role != "" && !pki.ValidRole(role) {
				return &ExitError{Code: 2, Err: errors.New("--role must be node, ramdisk, site or node-tenant")}
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
			t, err := cl.CreateJoinToken(contextOf(cmd), role, name, ttl)
			if err != nil {
				if of != nil {
					of.Abort()
				}
				return apiErr(err)
			}
			if of != nil {
				if err := of.Commit([]byte(t.Token + "\n")); err != nil {
					return err
				}
				t.Token = ""
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), t)
			}
			if out != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "token %s written to %s (0600), expires %s\n", t.ID, out, timeText(t.ExpiresAt))
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s\n", t.Token)
			fmt.Fprintf(cmd.ErrOrStderr(), "token %s expires %s; give it to bcd join through BCD_JOIN_TOKEN or standard input\n", t.ID, timeText(t.ExpiresAt))
			return nil
		},
	}
	create.Flags().StringVar(&role, "role", "", "certificate role: node, ramdisk, site, node-tenant (default node in the root tenant, node-tenant in any other; other tenants may mint only node-tenant)")
	create.Flags().StringVar(&name, "name", "", "name for the node")
	create.Flags().DurationVar(&ttl, "ttl", time.Hour, "how long the token is valid")
	create.Flags().StringVar(&out, "out", "", "write the token to this new 0600 file instead of printing it")
	forceFlag(create, &force)
	create.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.AddCommand(create)
	return c
}

func commandsCmd() *cobra.Command {
	c := &cobra.Command{Use: "commands", Short: "Signed commands to nodes"}
	c.AddCommand(commandsRunCmd(), commandsShowCmd(), commandsListCmd(), fanoutCmd(), attestationCmd(), verifyAttestationCmd())
	return c
}

// commandsRunCmd queues a command for a node and, with --wait, waits for
// its result.
func commandsRunCmd() *cobra.Command {
	var node, kind, payload, batch string
	var wait, asJSON bool
	var timeout time.Duration
	run := &cobra.Command{
		Use:   "run",
		Short: "Queue a command for a node and print its id; with --wait, wait for its result and show it (exit 0 only when it succeeded)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if node == "" || kind == "" {
				return &ExitError{Code: 2, Err: errors.New("--node and --kind are required")}
			}
			var p json.RawMessage
			if payload != "" {
				if !json.Valid([]byte(payload)) {
					return &ExitError{Code: 2, Err: errors.New("--payload is not valid JSON")}
				}
				p = json.RawMessage(payload)
			}
			cl, err := apiClient()
			if err != nil {
				return err
			}
			ctx := contextOf(cmd)
			if err := resolveArg(cmd, cl, "node", &node); err != nil {
				return err
			}
			var cm client.Command
			if batch != "" {
				cm, err = cl.CreateCommandInBatch(ctx, node, kind, p, batch)
			} else {
				cm, err = cl.CreateCommand(ctx, node, kind, p)
			}
			if err != nil {
				return apiErr(err)
			}
			if wait {
				tctx, cancel := contextWithTimeout(ctx, timeout)
				defer cancel()
				progress := func(c client.Command) {
					if isTerminal(os.Stderr) && !asJSON {
						fmt.Fprintf(cmd.ErrOrStderr(), "%s: %s\n", c.ID, c.State)
					}
				}
				id := cm.ID
				cm, err = cl.WaitCommand(tctx, id, 100*time.Millisecond, progress)
				if err != nil {
					return &ExitError{Code: 1, Err: fmt.Errorf("waiting for %s (follow it with `better-compute commands show %s`): %w", id, id, apiErr(err))}
				}
			}
			if !wait && !asJSON {
				// Queued, not waited for: the new command's id alone, as
				// every create prints, so that C=$(… commands run …) works.
				_, err := fmt.Fprintln(cmd.OutOrStdout(), cm.ID)
				return err
			}
			if err := showCommand(cmd, cm, asJSON); err != nil {
				return err
			}
			if wait && cm.State != "succeeded" {
				return &ExitError{Code: 1}
			}
			return nil
		},
	}
	run.Flags().StringVar(&node, "node", "", "node id")
	run.Flags().StringVar(&kind, "kind", "", "command kind (node.ping, diag.run, node.reboot, disk.wipe)")
	run.Flags().StringVar(&payload, "payload", "", "JSON payload")
	run.Flags().StringVar(&batch, "batch", "", "approved batch the command belongs to (required for destructive kinds)")
	run.Flags().BoolVar(&wait, "wait", false, "wait for the result")
	run.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "how long --wait waits")
	run.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return run
}

// commandsShowCmd shows one command.
func commandsShowCmd() *cobra.Command {
	var showJSON bool
	show := &cobra.Command{
		Use:   "show ID",
		Short: "Show a command",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := apiClient()
			if err != nil {
				return err
			}
			if err := resolveArg(cmd, cl, "command", &args[0]); err != nil {
				return err
			}
			cm, err := cl.Command(contextOf(cmd), args[0])
			if err != nil {
				return apiErr(err)
			}
			return showCommand(cmd, cm, showJSON)
		},
	}
	show.Flags().BoolVar(&showJSON, "json", false, "print JSON")
	return show
}

// commandsListCmd lists commands, newest first.
func commandsListCmd() *cobra.Command {
	var lnode, lstate, lfanout string
	var llimit int
	var ljson bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List commands, newest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			in := client.CommandListIn{NodeID: lnode, State: lstate, FanoutID: lfanout, Limit: llimit}
			return call(cmd, "commands.list", in, ljson,
				table("commands", "id", "node_id", "kind", "state", "attested", "late", "reason", "created_at", "fanout_id"))
		},
	}
	list.Flags().StringVar(&lfanout, "fanout", "", "only this fan-out's (the id commands fanout prints)")
	list.Flags().StringVar(&lnode, "node", "", "only this node's")
	list.Flags().StringVar(&lstate, "state", "", "only in this state: queued, sent, running, succeeded, failed or cancelled")
	list.Flags().IntVar(&llimit, "limit", 100, "at most this many (up to 1000)")
	list.Flags().BoolVar(&ljson, "json", false, "print JSON")
	return list
}

func showCommand(cmd *cobra.Command, c client.Command, asJSON bool) error {
	if asJSON {
		return printJSON(cmd.OutOrStdout(), c)
	}
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "%s %s\n", pad("id", 9), c.ID)
	fmt.Fprintf(w, "%s %s\n", pad("node", 9), c.NodeID)
	fmt.Fprintf(w, "%s %s\n", pad("kind", 9), c.Kind)
	fmt.Fprintf(w, "%s %s\n", pad("state", 9), c.State)
	fmt.Fprintf(w, "%s %v\n", pad("attested", 9), c.Attested)
	if c.Late {
		// The node's attested result arrived after the command expired.
		fmt.Fprintf(w, "%s %v\n", pad("late", 9), c.Late)
	}
	if c.BatchID != "" {
		fmt.Fprintf(w, "%s %s\n", pad("batch", 9), c.BatchID)
	}
	if c.FanoutID != "" {
		fmt.Fprintf(w, "%s %s\n", pad("fanout", 9), c.FanoutID)
	}
	if c.Reason != "" {
		fmt.Fprintf(w, "%s %s\n", pad("reason", 9), c.Reason)
	}
	if len(c.Result) > 0 && string(c.Result) != "null" {
		fmt.Fprintf(w, "%s %s\n", pad("result", 9), c.Result)
	}
	return nil
}
