package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/internal/breakglass"
	"github.com/bettercompute/bettercompute/internal/sshca"
)

// sshCertCmd is `ssh-cert`: a break-glass SSH certificate for one account
// on one node (nodes.issueSshCert), and its revoke and krl subcommands.
// The account is checked here too (sshca.ValidAccount), so a name ssh
// would read as an option never reaches the API or a file.
func sshCertCmd() *cobra.Command {
	var node, account, pubFile, out string
	var validity int64
	var asJSON, force bool
	c := &cobra.Command{
		Use:   "ssh-cert --node ID --account A --public-key FILE --out FILE",
		Short: "Get a break-glass SSH certificate (at most 1 h) for one account on one node; revoke it; fetch the node's KRL",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if node == "" || pubFile == "" || out == "" {
				return &ExitError{Code: 2, Err: errors.New("--node, --account, --public-key and --out are required")}
			}
			if !sshca.ValidAccount(account) {
				return &ExitError{Code: 2, Err: errors.New("--account must be a Unix account name (^[a-z_][a-z0-9_-]{0,31}$)")}
			}
			pub, err := readBounded(pubFile, sshca.MaxPublicKeyLine)
			if err != nil {
				return &ExitError{Code: 2, Err: fmt.Errorf("read --public-key: %w", err)}
			}
			if _, err := sshca.ParsePublicKey(pub); err != nil {
				return &ExitError{Code: 2, Err: fmt.Errorf("--public-key: %w", err)}
			}
			o, err := openOut(out, force, publicFileMode)
			if err != nil {
				return err
			}
			cl, err := apiClient()
			if err == nil {
				err = resolveArg(cmd, cl, "node", &node)
			}
			if err != nil {
				o.Abort()
				return err
			}
			var got breakglass.Issued
			if err := cl.Call(contextOf(cmd), "nodes.issueSshCert", breakglass.IssueIn{NodeID: node, Account: account, PublicKey: string(pub), ValiditySeconds: validity}, &got); err != nil {
				o.Abort()
				return apiErr(err)
			}
			if err := o.Commit([]byte(got.Certificate + "\n")); err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), got)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "serial     %s\nprincipal  %s\nvalid      %s to %s\ncertificate written to %s\n",
				got.Serial, got.Principal, got.ValidAfter.Format(time.RFC3339), got.ValidBefore.Format(time.RFC3339), out)
			return err
		},
	}
	c.Flags().StringVar(&node, "node", "", "node id")
	c.Flags().StringVar(&account, "account", "", "Unix account on the node")
	c.Flags().StringVar(&pubFile, "public-key", "", "your SSH public key file (one authorized_keys line)")
	c.Flags().StringVar(&out, "out", "", "write the certificate here (0644)")
	c.Flags().Int64Var(&validity, "validity", 0, "seconds, 1 to 3600 (default 3600; never past your credential)")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	forceFlag(c, &force)

	c.AddCommand(sshCertRevokeCmd(), sshCertKRLCmd())
	return c
}

// sshCertRevokeCmd is `ssh-cert revoke`: nodes.revokeSshCert.
func sshCertRevokeCmd() *cobra.Command {
	var rnode, serial string
	var rjson bool
	revoke := &cobra.Command{
		Use:   "revoke --node ID --serial S",
		Short: "Revoke a break-glass certificate: its serial goes into the node's KRL",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if rnode == "" || serial == "" {
				return &ExitError{Code: 2, Err: errors.New("--node and --serial are required")}
			}
			return call(cmd, "nodes.revokeSshCert", map[string]any{"node_id": rnode, "serial": serial}, rjson,
				func(o map[string]any) string {
					return fmt.Sprintf("revoked %v (ssh.access command %v)\n", o["serial"], o["command_id"])
				})
		},
	}
	revoke.Flags().StringVar(&rnode, "node", "", "node id")
	revoke.Flags().StringVar(&serial, "serial", "", "the certificate's serial")
	revoke.Flags().BoolVar(&rjson, "json", false, "print JSON")

	return revoke
}

// sshCertKRLCmd is `ssh-cert krl`: the node's KRL as the node has it.
func sshCertKRLCmd() *cobra.Command {
	var knode, kout string
	var kjson, kforce bool
	krl := &cobra.Command{
		Use:   "krl --node ID --out FILE",
		Short: "Write the node's key revocation list as the node has it (ssh-keygen -Q -f FILE reads it)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if knode == "" || kout == "" {
				return &ExitError{Code: 2, Err: errors.New("--node and --out are required")}
			}
			cl, err := apiClient()
			if err != nil {
				return err
			}
			if err := resolveArg(cmd, cl, "node", &knode); err != nil {
				return err
			}
			var got breakglass.KRLOut
			if err := cl.Call(contextOf(cmd), "nodes.sshKrl", breakglass.KRLIn{NodeID: knode}, &got); err != nil {
				return apiErr(err)
			}
			if err := writeOut(kout, kforce, got.KRL, publicFileMode); err != nil {
				return err
			}
			if kjson {
				return printJSON(cmd.OutOrStdout(), map[string]any{"generation": got.Generation, "command_id": got.CommandID, "revoked": got.Revoked, "out": kout})
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "KRL generation %d (%d revoked) written to %s\n", got.Generation, len(got.Revoked), kout)
			return err
		},
	}
	krl.Flags().StringVar(&knode, "node", "", "node id")
	krl.Flags().StringVar(&kout, "out", "", "write the KRL here (0644)")
	krl.Flags().BoolVar(&kjson, "json", false, "print JSON")
	forceFlag(krl, &kforce)
	return krl
}

// readBounded reads path, refusing a file over limit bytes.
func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("over %d bytes", limit)
	}
	return b, nil
}
