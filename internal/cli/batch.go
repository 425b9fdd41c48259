package cli

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/quorum/approverkeys"
	"github.com/bettercompute/bettercompute/internal/quorum/quorumwire"
)

// approversCmd is `better-compute approvers`: make approver keys for a test
// or dev deployment, pin them into a fresh PKI bundle, show the set in force.
func approversCmd() *cobra.Command {
	c := &cobra.Command{Use: "approvers", Short: "Destructive-batch approvers: keys held off the control plane"}
	c.AddCommand(approversInitCmd(), approversPinCmd(), approversShowCmd())
	return c
}

// approversInitCmd makes approver key files for a test or dev deployment.
func approversInitCmd() *cobra.Command {
	var count, threshold int
	var out string
	var force bool
	initC := &cobra.Command{
		Use:   "init",
		Short: "Make approver key files for a test or dev deployment (in production each approver makes their own)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return &ExitError{Code: 2, Err: errors.New("--out is required")}
			}
			if threshold < 1 || threshold > count {
				return &ExitError{Code: 2, Err: fmt.Errorf("--threshold must be 1..%d", count)}
			}
			if err := replaceApproverFiles(out, count, force); err != nil {
				return err
			}
			keys, err := approverkeys.Generate(out, count)
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "made %d approver keys in %s (approver-N.key 0600, approver-N.pub); threshold to pin: %d\n", len(keys), out, threshold)
			for i, k := range keys {
				fmt.Fprintf(w, "  approver-%d  %s\n", i+1, base64.StdEncoding.EncodeToString(k))
			}
			fmt.Fprintf(w, "pin them before nodes join:\n  better-compute approvers pin --pki pki --keys %s --threshold %d\n", out, threshold)
			return nil
		},
	}
	initC.Flags().IntVar(&count, "count", 3, "number of approvers")
	initC.Flags().IntVar(&threshold, "threshold", 2, "approvals a destructive batch needs")
	initC.Flags().StringVar(&out, "out", "", "directory for the key files (created 0700)")
	forceFlag(initC, &force)
	return initC
}

// approversPinCmd pins approver public keys into a fresh PKI bundle.
func approversPinCmd() *cobra.Command {
	var pkiDir string
	var keyPaths []string
	var pinThreshold int
	pin := &cobra.Command{
		Use:   "pin",
		Short: "Pin approver public keys and the threshold into a fresh PKI bundle, before any node joins",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(keyPaths) == 0 {
				return &ExitError{Code: 2, Err: errors.New("--keys is required (a directory of .pub files, or files)")}
			}
			keys, err := approverkeys.LoadPublic(keyPaths)
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			b, err := pki.PinApprovers(pkiDir, keys, pinThreshold)
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "pinned %d approvers, threshold %d, into %s; nodes that join from now on pin them\n", len(b.Approvers), b.Threshold, pkiDir)
			return nil
		},
	}
	pin.Flags().StringVar(&pkiDir, "pki", "pki", "PKI bundle directory")
	pin.Flags().StringSliceVar(&keyPaths, "keys", nil, "approver public keys: a directory of .pub files, or .pub/.key files (repeatable)")
	pin.Flags().IntVar(&pinThreshold, "threshold", 0, "approvals a destructive batch needs")
	return pin
}

// approversShowCmd shows the approver set in force.
func approversShowCmd() *cobra.Command {
	var asJSON bool
	show := &cobra.Command{
		Use:   "show",
		Short: "Show the approver set in force",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := apiClient()
			if err != nil {
				return err
			}
			set, err := cl.Approvers(contextOf(cmd))
			if err != nil {
				return apiErr(err)
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), set)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "deployment %s, generation %d: %d of %d approvers must sign a destructive batch\n", set.Deployment, set.Generation, set.Threshold, len(set.Keys))
			for _, k := range set.Keys {
				fmt.Fprintf(w, "  %s\n", k)
			}
			return nil
		},
	}
	show.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return show
}

// batchCmd is `better-compute batch`: propose, review, approve destructive
// batches and change the approver set.
func batchCmd() *cobra.Command {
	c := &cobra.Command{Use: "batch", Short: "Destructive batches: the only way a destructive command runs"}
	c.AddCommand(batchCreateCmd(), batchShowCmd(), batchListCmd(), batchApproveCmd(), batchSignApproversCmd())
	return c
}

func batchCreateCmd() *cobra.Command {
	var kind, payload string
	var nodes []string
	var unbound, asJSON bool
	var expires time.Duration
	c := &cobra.Command{
		Use:   "create",
		Short: "Propose a batch: one leaf per --node for --kind, bound to --payload (default {}) or --unbound; prints its id (--json: the whole batch)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if kind == "" || len(nodes) == 0 {
				return &ExitError{Code: 2, Err: errors.New("--kind and at least one --node are required")}
			}
			if unbound && payload != "" {
				return &ExitError{Code: 2, Err: errors.New("--unbound takes no --payload")}
			}
			if payload != "" && !json.Valid([]byte(payload)) {
				return &ExitError{Code: 2, Err: errors.New("--payload is not valid JSON")}
			}
			cl, err := apiClient()
			if err != nil {
				return err
			}
			// One resolver: the node list is read once for every --node.
			ids, err := newResolver(cl).resolveAll(contextOf(cmd), "node", nodes)
			if err != nil {
				return err
			}
			leaves := make([]client.LeafRequest, len(ids))
			for i := range ids {
				leaves[i] = client.LeafRequest{NodeID: ids[i], Kind: kind, Unbound: unbound}
				if payload != "" {
					leaves[i].Payload = json.RawMessage(payload)
				}
			}
			b, err := cl.CreateBatch(contextOf(cmd), leaves, expires)
			if err != nil {
				return apiErr(err)
			}
			if asJSON {
				return showBatch(cmd.OutOrStdout(), b, true)
			}
			// The new batch's id alone, as every create prints, so that
			// B=$(better-compute batch create …) works; `batch show` has
			// the rest.
			_, err = fmt.Fprintln(cmd.OutOrStdout(), b.ID)
			return err
		},
	}
	c.Flags().StringVar(&kind, "kind", "", "command kind of every leaf (node.reboot, disk.wipe, …)")
	c.Flags().StringArrayVar(&nodes, "node", nil, "node name, id or unique id prefix (repeat for more leaves)")
	c.Flags().StringVar(&payload, "payload", "", "JSON payload each leaf is bound to (default {})")
	c.Flags().BoolVar(&unbound, "unbound", false, "leaves admit any payload of the kind (flagged to approvers)")
	c.Flags().DurationVar(&expires, "expires", time.Hour, "how long the batch can be approved and run (at most 168h)")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func batchShowCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "show ID",
		Short: "Show a batch: its leaves with their flags, its root (checked against the leaves here), approvals and proposer",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := apiClient()
			if err != nil {
				return err
			}
			b, err := cl.Batch(contextOf(cmd), args[0])
			if err != nil {
				return apiErr(err)
			}
			return showBatch(cmd.OutOrStdout(), b, asJSON)
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func batchListCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "list",
		Short: "List the newest batches",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := apiClient()
			if err != nil {
				return err
			}
			bs, err := cl.Batches(contextOf(cmd))
			if err != nil {
				return apiErr(err)
			}
			if asJSON {
				if bs == nil {
					bs = []client.Batch{}
				}
				return printJSON(cmd.OutOrStdout(), map[string]any{"batches": bs})
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSTATE\tAPPROVALS\tUNBOUND\tEXPIRES\tPROPOSER")
			for _, b := range bs {
				fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%v\t%s\t%s\n", b.ID, b.State, len(b.Approvals), b.Threshold, b.Unbound, timeText(b.ExpiresAt), b.Proposer)
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// verifyLeaves rebuilds the canonical leaves from what the server showed,
// checks each shown payload against its digest, and returns the root
// recomputed here. Nothing the server says about the root is used.
func verifyLeaves(b client.Batch) ([]byte, error) {
	if len(b.Leaves) == 0 {
		return nil, errors.New("the batch shows no leaves")
	}
	leaves := make([]quorumwire.Leaf, len(b.Leaves))
	for i, lv := range b.Leaves {
		if lv.Index != i {
			return nil, fmt.Errorf("leaf %d is shown at index %d", i, lv.Index)
		}
		if lv.Unbound {
			leaves[i] = quorumwire.UnboundLeaf(lv.NodeID, lv.Kind)
			continue
		}
		d, err := hex.DecodeString(lv.PayloadSHA256)
		if err != nil || len(d) != 32 {
			return nil, fmt.Errorf("leaf %d has no valid payload digest", i)
		}
		l := quorumwire.Leaf{NodeID: lv.NodeID, Kind: lv.Kind}
		copy(l.PayloadSHA256[:], d)
		if len(lv.Payload) > 0 {
			canon, err := quorumwire.CanonicalPayload(lv.Payload)
			if err != nil || quorumwire.BoundLeaf(lv.NodeID, lv.Kind, canon).PayloadSHA256 != l.PayloadSHA256 {
				return nil, fmt.Errorf("leaf %d's payload does not match its digest", i)
			}
		}
		leaves[i] = l
	}
	return quorumwire.Root(leaves)
}

func showBatch(w io.Writer, b client.Batch, asJSON bool) error {
	if asJSON {
		return printJSON(w, b)
	}
	root, verr := verifyLeaves(b)
	check := "matches the leaves (recomputed here)"
	switch {
	case verr != nil:
		check = "LEAVES DO NOT CHECK: " + verr.Error()
	case hex.EncodeToString(root) != b.Root:
		check = "DOES NOT MATCH the leaves: recomputed " + hex.EncodeToString(root)
	}
	fmt.Fprintf(w, "%s %s\n", pad("batch", 11), b.ID)
	fmt.Fprintf(w, "%s %s\n", pad("state", 11), b.State)
	fmt.Fprintf(w, "%s %s\n", pad("proposer", 11), b.Proposer)
	fmt.Fprintf(w, "%s %s\n", pad("deployment", 11), b.Deployment)
	fmt.Fprintf(w, "%s %s (Unix ms %d, as approvers sign it)\n", pad("expires", 11), timeText(b.ExpiresAt), b.ExpiresMS)
	fmt.Fprintf(w, "%s %s %s\n", pad("root", 11), b.Root, check) // archtest:not-tenant (the batch's Merkle root)
	fmt.Fprintf(w, "%s %d of %d\n", pad("approvals", 11), len(b.Approvals), b.Threshold)
	for _, a := range b.Approvals {
		fmt.Fprintf(w, "  %s (submitted by %s)\n", a.ApproverKey, a.SubmittedBy)
	}
	if b.Unbound {
		fmt.Fprintf(w, "WARNING: this batch has unbound leaves: each admits ANY payload of its kind for its node\n")
	}
	fmt.Fprintf(w, "leaves:\n")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  #\tNODE\tKIND\tPAYLOAD")
	for _, l := range b.Leaves {
		p := "sha256:" + l.PayloadSHA256
		if len(l.Payload) > 0 {
			p += " " + oneLine(string(l.Payload), 120)
		}
		if l.Unbound {
			p = "UNBOUND (any payload)"
		}
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\n", l.Index, l.NodeID, l.Kind, p)
	}
	return tw.Flush()
}

// oneLine clips s to n bytes on one line, without control characters.
func oneLine(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

func batchApproveCmd() *cobra.Command {
	var keyFile, deployment string
	var asJSON, yes bool
	c := &cobra.Command{
		Use:   "approve ID",
		Short: "Review a batch, recompute its root from its leaves here, and sign it with an approver key",
		Long: "Fetches the batch's leaves, recomputes the Merkle root locally and refuses (exit 1) when it differs from the\n" +
			"server's, shows the batch (id, root, each leaf's node and kind) and asks on a terminal (--yes: do not ask;\n" +
			"without a terminal --yes is required, else exit 2), then signs (deployment, batch id, root, expiry) with the\n" +
			"approver key and submits the signature.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if keyFile == "" {
				return &ExitError{Code: 2, Err: errors.New("--key is required")}
			}
			key, err := approverkeys.LoadPrivate(keyFile)
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			cl, err := apiClient()
			if err != nil {
				return err
			}
			ctx := contextOf(cmd)
			b, err := cl.Batch(ctx, args[0])
			if err != nil {
				return apiErr(err)
			}
			root, err := verifyLeaves(b)
			if err != nil {
				return &ExitError{Code: 1, Err: fmt.Errorf("refusing to sign batch %s: %w", b.ID, err)}
			}
			if got := hex.EncodeToString(root); got != b.Root {
				return &ExitError{Code: 1, Err: fmt.Errorf("refusing to sign batch %s: the root recomputed from its leaves (%s) differs from the server's (%s)", b.ID, got, b.Root)}
			}
			if deployment != "" && deployment != b.Deployment {
				return &ExitError{Code: 1, Err: fmt.Errorf("refusing to sign batch %s: it is for deployment %q, not %q", b.ID, b.Deployment, deployment)}
			}
			if !time.UnixMilli(b.ExpiresMS).After(time.Now()) {
				return &ExitError{Code: 1, Err: fmt.Errorf("refusing to sign batch %s: it expired at %s", b.ID, timeText(b.ExpiresAt))}
			}
			if !asJSON || !yes {
				if err := showBatch(cmd.ErrOrStderr(), b, false); err != nil {
					return err
				}
			}
			if err := confirmOrYes(cmd, yes, "sign batch "+b.ID+" (root "+b.Root+") with this approver key?"); err != nil {
				return err
			}
			pub := key.Public().(ed25519.PublicKey)
			sig := ed25519.Sign(key, quorumwire.ApprovalMessage(b.Deployment, b.ID, root, b.ExpiresMS))
			after, err := cl.ApproveBatch(ctx, b.ID, pub, sig)
			if err != nil {
				return apiErr(err)
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), after)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "approved batch %s as %s: %d of %d approvals, state %s\n",
				after.ID, base64.StdEncoding.EncodeToString(pub), len(after.Approvals), after.Threshold, after.State)
			return nil
		},
	}
	c.Flags().StringVar(&keyFile, "key", "", "approver private key file (0600)")
	c.Flags().StringVar(&deployment, "deployment", "", "refuse unless the batch is for this deployment")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.Flags().BoolVar(&yes, "yes", false, "sign without asking (for scripts; without a terminal it is required)")
	return c
}

func batchSignApproversCmd() *cobra.Command {
	var keyFile, deployment string
	var newKeys []string
	var threshold int
	var asJSON bool
	c := &cobra.Command{
		Use:   "sign-approvers",
		Short: "Sign a new approver set with a current approver's key; it takes effect once the current threshold signed it",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if keyFile == "" || len(newKeys) == 0 || threshold < 1 {
				return &ExitError{Code: 2, Err: errors.New("--key, --new-keys and --threshold are required")}
			}
			key, err := approverkeys.LoadPrivate(keyFile)
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			keys, err := approverkeys.LoadPublic(newKeys)
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			raw := make([][]byte, len(keys))
			for i, k := range keys {
				raw[i] = k
			}
			cl, err := apiClient()
			if err != nil {
				return err
			}
			ctx := contextOf(cmd)
			cur, err := cl.Approvers(ctx)
			if err != nil {
				return apiErr(err)
			}
			if deployment != "" && deployment != cur.Deployment {
				return &ExitError{Code: 1, Err: fmt.Errorf("refusing to sign: the control plane is deployment %q, not %q", cur.Deployment, deployment)}
			}
			next, err := quorumwire.NewApproverSet(cur.Generation+1, threshold, raw)
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			pub := key.Public().(ed25519.PublicKey)
			sig := ed25519.Sign(key, quorumwire.ApproverSetMessage(cur.Deployment, next))
			st, err := cl.SignApprovers(ctx, next.Generation, next.Threshold, next.RawKeys(), pub, sig)
			if err != nil {
				return apiErr(err)
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), st)
			}
			state := "waiting for more current approvers to sign the same set"
			if st.Applied {
				state = "applied: nodes accept it from the next message they receive"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "approver set generation %d (%d of %d keys): %d of %d signatures; %s\n",
				st.Proposed.Generation, st.Proposed.Threshold, len(st.Proposed.Keys), st.Signed, st.Needed, state)
			return nil
		},
	}
	c.Flags().StringVar(&keyFile, "key", "", "a current approver's private key file (0600)")
	c.Flags().StringSliceVar(&newKeys, "new-keys", nil, "the new set's public keys: a directory of .pub files, or files (repeatable)")
	c.Flags().IntVar(&threshold, "threshold", 0, "the new set's threshold")
	c.Flags().StringVar(&deployment, "deployment", "", "refuse unless the control plane is this deployment")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}
