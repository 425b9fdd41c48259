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

	"github.com/bettercompute/bettercompute/internal/breakglass"
	"github.com/bettercompute/bettercompute/internal/clisafe"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/sshca"
)

// sshAccessWait bounds the wait for the node to apply the access state a
// new certificate needs (its ssh.access command).
const sshAccessWait = 2 * time.Minute

// sshCmd is `better-compute ssh`: a break-glass shell on a node through
// its own session. It makes a one-time key pair, gets a certificate for it
// (nodes.issueSshCert), waits until the node applied the access state the
// certificate needs, and runs the system ssh with no configuration file,
// the tunnel as its ProxyCommand, every forwarding and local command off,
// and "--" before the host, so nothing it adds is read as an ssh option.
func sshCmd() *cobra.Command {
	var node, account, sshBin string
	var port int
	c := &cobra.Command{
		Use:   "ssh --node ID [--account A] [-- COMMAND...]",
		Short: "Open a break-glass shell on a node: a one-time key, a certificate of at most 1 h, and ssh through the node's own session",
		Long: "Open a break-glass shell on a node. A one-time Ed25519 key pair is made in a private temporary folder, " +
			"nodes.issueSshCert (compute:nodes:ssh-root on the node) signs a certificate for it (at most 1 h, principal ACCOUNT@NODE, " +
			"permit-pty only), and the system ssh runs with -F none, `better-compute tunnel --stdio` as its ProxyCommand, " +
			"agent, X11 and port forwarding and local commands off, and `--` before the host. The node's host key is pinned " +
			"on first use in ~/.better-compute/known_hosts under the node's id. The key pair is deleted when ssh exits; " +
			"the exit status is ssh's (255 when ssh itself failed), or 125 when this command failed before ssh ran.",
		Annotations: map[string]string{programExitCodes: "1"},
		RunE: func(cmd *cobra.Command, args []string) error {
			if !ids.ValidName(node) {
				return &ExitError{Code: 2, Err: errors.New("--node: a node id is required")}
			}
			if !sshca.ValidAccount(account) {
				return &ExitError{Code: 2, Err: errors.New("--account must be a Unix account name (^[a-z_][a-z0-9_-]{0,31}$)")}
			}
			if port < 1 || port > 65535 {
				return &ExitError{Code: 2, Err: errors.New("--port: a port is 1 to 65535")}
			}
			if cmd.ArgsLenAtDash() != 0 && len(args) > 0 {
				return &ExitError{Code: 2, Err: errors.New("a remote command goes after --: better-compute ssh --node ID -- COMMAND")}
			}
			self, err := os.Executable()
			if err != nil || strings.ContainsAny(self, "'\n") {
				return &ExitError{Code: 2, Err: errors.New("cannot name this program for ssh's ProxyCommand")}
			}
			cl, err := apiClient()
			if err != nil {
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
			if err := cl.Call(ctx, "nodes.issueSshCert", breakglass.IssueIn{NodeID: node, Account: account, PublicKey: pubLine}, &got); err != nil {
				return apiErr(err)
			}
			if err := os.WriteFile(keyFile+"-cert.pub", []byte(got.Certificate+"\n"), 0o600); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "certificate %s for %s, valid until %s\n", got.Serial, got.Principal, got.ValidBefore.UTC().Format(time.RFC3339))
			if got.CommandID != "" {
				wctx, cancel := context.WithTimeout(ctx, sshAccessWait)
				cm, err := cl.WaitCommand(wctx, got.CommandID, 200*time.Millisecond, nil)
				cancel()
				if err != nil {
					return fmt.Errorf("the node did not apply the access state (ssh.access command %s): %w", got.CommandID, apiErr(err))
				}
				if cm.State != "succeeded" {
					return fmt.Errorf("the node did not apply the access state: ssh.access command %s %s", got.CommandID, cm.State)
				}
			}
			known, err := knownHostsFile()
			if err != nil {
				return err
			}
			argv := sshArgv(sshProxy(self, node, port, caFile()), keyFile, known, account, node, args)
			ssh := exec.CommandContext(ctx, sshBin, argv...)
			// ssh talks to the terminal itself (a remote shell's
			// output, its own prompts): unfiltered, so that a *os.File
			// reaches it as is and it can tell a terminal.
			ssh.Stdin, ssh.Stdout, ssh.Stderr = cmd.InOrStdin(), clisafe.Raw(cmd.OutOrStdout()), clisafe.Raw(cmd.ErrOrStderr())
			err = ssh.Run()
			var exit *exec.ExitError
			switch {
			case err == nil:
				return nil
			case errors.As(err, &exit):
				return &programExit{code: exit.ExitCode()}
			}
			return fmt.Errorf("run %s: %w", sshBin, err)
		},
	}
	c.Flags().StringVar(&node, "node", "", "node id")
	c.Flags().StringVar(&account, "account", "root", "Unix account on the node")
	c.Flags().IntVar(&port, "port", 22, "the node's sshd port on its loopback (on the node's tunnel allow list)")
	c.Flags().StringVar(&sshBin, "ssh", "ssh", "the ssh program to run")
	return c
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
