package cli

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/crypto/ssh"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/breakglass"
	"github.com/bettercompute/bettercompute/internal/clisafe"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/sshca"
)

// sshAccessWait bounds the wait for the node to apply the access state a
// new certificate needs (its ssh.access command).
const sshAccessWait = 2 * time.Minute

// defaultAccount is the Unix account break-glass logs in as by default.
const defaultAccount = "root" // archtest:not-tenant (a Unix account, not a tenant)

// sshCmd is `better-compute ssh`: a break-glass shell on a node through
// its own session. It makes a one-time key pair, gets a certificate for it
// (nodes.issueSshCert), waits until the node applied the access state the
// certificate needs, and runs the system ssh with no configuration file,
// the tunnel as its ProxyCommand, every forwarding and local command off,
// and "--" before the host, so nothing it adds is read as an ssh option.
func sshCmd() *cobra.Command {
	var o sshOptions
	c := &cobra.Command{
		Use:   "ssh --node ID [--account A] [-- COMMAND...]",
		Short: "Open a break-glass shell on a node: a one-time key, a certificate of at most 1 h, and ssh through the node's own session",
		Long: "Open a break-glass shell on a node. A one-time Ed25519 key pair is made in a private temporary folder, " +
			"nodes.issueSshCert (compute:nodes:ssh-root on the node) signs a certificate for it (at most 1 h, principal ACCOUNT@NODE, " +
			"permit-pty only), and the system ssh runs with -F none, `better-compute tunnel --stdio` as its ProxyCommand, " +
			"agent, X11 and port forwarding and local commands off, and `--` before the host. The node's host key is pinned " +
			"on first use in ~/.better-compute/known_hosts under the node's id. The key pair is deleted when ssh exits. " +
			"The exit status is ssh's own (the remote command's, or 255 when ssh failed); 2 for a usage error and 1 when " +
			"this command failed before ssh ran.",
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.check(cmd, args); err != nil {
				return err
			}
			return o.run(cmd, args)
		},
	}
	c.Flags().StringVar(&o.node, "node", "", "node id")
	c.Flags().StringVar(&o.account, "account", defaultAccount, "Unix account on the node")
	c.Flags().IntVar(&o.port, "port", 22, "the node's sshd port on its loopback (on the node's tunnel allow list)")
	c.Flags().StringVar(&o.sshBin, "ssh", "ssh", "the ssh program to run")
	return c
}

// sshOptions are `better-compute ssh`'s flags.
type sshOptions struct {
	node, account, sshBin string
	port                  int
}

// check refuses bad flags and arguments (exit 2) before anything is asked.
func (o *sshOptions) check(cmd *cobra.Command, args []string) error {
	switch {
	case !ids.ValidName(o.node):
		return &ExitError{Code: 2, Err: errors.New("--node: a node id is required")}
	case !sshca.ValidAccount(o.account):
		return &ExitError{Code: 2, Err: errors.New("--account must be a Unix account name (^[a-z_][a-z0-9_-]{0,31}$)")}
	case o.port < 1 || o.port > 65535:
		return &ExitError{Code: 2, Err: errors.New("--port: a port is 1 to 65535")}
	case cmd.ArgsLenAtDash() != 0 && len(args) > 0:
		return &ExitError{Code: 2, Err: errors.New("a remote command goes after --: better-compute ssh --node ID -- COMMAND")}
	}
	return nil
}

// run gets the certificate, waits for the node's access state and runs
// ssh, exiting with ssh's status.
func (o *sshOptions) run(cmd *cobra.Command, args []string) error {
	self, err := os.Executable()
	if err != nil || strings.ContainsAny(self, "'\n") {
		return errors.New("cannot name this program for ssh's ProxyCommand")
	}
	cl, err := apiClient()
	if err != nil {
		return err
	}
	if err := resolveArg(cmd, cl, "node", &o.node); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "bc-ssh-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	keyFile, pubLine, err := oneTimeKey(dir)
	if err != nil {
		return err
	}
	ctx := contextOf(cmd)
	var got breakglass.Issued
	if err := cl.Call(ctx, "nodes.issueSshCert", breakglass.IssueIn{NodeID: o.node, Account: o.account, PublicKey: pubLine}, &got); err != nil {
		return apiErr(err)
	}
	if err := os.WriteFile(keyFile+"-cert.pub", []byte(got.Certificate+"\n"), 0o600); err != nil {
		return err
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "certificate %s for %s, valid until %s\n", got.Serial, got.Principal, got.ValidBefore.UTC().Format(time.RFC3339))
	if err := waitAccess(ctx, cl, got.CommandID); err != nil {
		return err
	}
	known, err := knownHostsFile()
	if err != nil {
		return err
	}
	ssh := exec.CommandContext(ctx, o.sshBin, sshArgv(sshProxy(self, o.node, o.port, caFile()), keyFile, known, o.account, o.node, args)...)
	// ssh talks to the terminal itself (a remote shell's output, its own
	// prompts): unfiltered, so that a *os.File reaches it as is and it
	// can tell a terminal.
	ssh.Stdin, ssh.Stdout, ssh.Stderr = cmd.InOrStdin(), clisafe.Raw(cmd.OutOrStdout()), clisafe.Raw(cmd.ErrOrStderr())
	err = ssh.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &exit):
		return &ExitError{Code: exit.ExitCode()}
	}
	return fmt.Errorf("run %s: %w", o.sshBin, err)
}

// waitAccess waits until the node applied the access state a new
// certificate needs (its ssh.access command; none when id is "").
func waitAccess(ctx context.Context, cl *client.Client, id string) error {
	if id == "" {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, sshAccessWait)
	defer cancel()
	cm, err := cl.WaitCommand(wctx, id, 200*time.Millisecond, nil)
	if err != nil {
		return fmt.Errorf("the node did not apply the access state (ssh.access command %s): %w", id, apiErr(err))
	}
	if cm.State != "succeeded" {
		return fmt.Errorf("the node did not apply the access state: ssh.access command %s %s", id, cm.State)
	}
	return nil
}

// oneTimeKey writes a fresh Ed25519 key pair into dir (the private key
// 0600, in OpenSSH's format) and returns the private key's path and the
// public key's authorized_keys line.
func oneTimeKey(dir string) (string, string, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", "", err
	}
	block, err := ssh.MarshalPrivateKey(priv, "better-compute one-time key")
	if err != nil {
		return "", "", err
	}
	path := filepath.Join(dir, "id_ed25519")
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		return "", "", err
	}
	sp, err := ssh.NewPublicKey(pub)
	if err != nil {
		return "", "", err
	}
	return path, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp))), nil
}

// knownHostsFile is ~/.better-compute/known_hosts (its folder made 0700).
func knownHostsFile() (string, error) {
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("known hosts: %w", err)
	}
	dir := filepath.Join(home, ".better-compute")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	return filepath.Join(dir, "known_hosts"), nil
}

// sshProxy is the ProxyCommand: this program's tunnel --stdio to port on
// node. ssh runs it with the user's shell, so each part is single-quoted
// (self holds no quote: checked by the caller; node and port are of
// fixed alphabets) and '%' is doubled against ssh's own expansion.
func sshProxy(self, node string, port int, ca string) string {
	q := func(s string) string { return "'" + strings.ReplaceAll(s, "%", "%%") + "'" }
	parts := []string{q(self), "tunnel", "--node", q(node), "--port", strconv.Itoa(port), "--stdio"}
	if ca != "" && !strings.ContainsAny(ca, "'\n") {
		parts = append(parts, "--ca-file", q(ca))
	}
	return strings.Join(parts, " ")
}

// sshArgv is the system ssh's argument vector: no configuration file, the
// key and certificate only, the proxy, every forwarding and local command
// off, the node's host key pinned under its id, then "--", the host and
// the remote command, so no argument after "--" is an option.
func sshArgv(proxy, keyFile, known, account, node string, remote []string) []string {
	argv := []string{"-F", "none",
		"-i", keyFile, "-o", "CertificateFile=" + keyFile + "-cert.pub",
		"-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none", "-o", "PreferredAuthentications=publickey",
		"-o", "ProxyCommand=" + proxy,
		"-o", "ForwardAgent=no", "-o", "ForwardX11=no", "-o", "ClearAllForwardings=yes",
		"-o", "PermitLocalCommand=no", "-o", "Tunnel=no",
		"-o", "HostKeyAlias=" + node, "-o", "UserKnownHostsFile=" + known, "-o", "GlobalKnownHostsFile=/dev/null",
		"-o", "StrictHostKeyChecking=accept-new",
		"-l", account, "--", node}
	return append(argv, remote...)
}
