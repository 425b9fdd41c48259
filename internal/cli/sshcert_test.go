package cli_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/sshca/sshdtest"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// TestSSHCertCommands: ssh-cert writes the certificate and prints its
// serial, principal and validity (--json too); an account with shell or
// ssh-option characters is refused with exit 2 before anything is asked
// or written; ssh-cert revoke and ssh-cert krl write the node's KRL as the
// node has it, which ssh-keygen -Q reads as revoking the certificate.
func TestSSHCertCommands(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{Nodes: 1})
	t.Setenv("BC_ADDR", "http://"+e.CP.APIAddr)
	t.Setenv("BC_API_KEY", e.AdminKey)
	node := e.Nodes[0].NodeID()
	dir := t.TempDir()
	s, _ := sshdtest.NewKey(t)
	pub := filepath.Join(dir, "id.pub")
	if err := os.WriteFile(pub, ssh.MarshalAuthorizedKey(s.PublicKey()), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, acc := range []string{"-oProxyCommand=x", "root;id", "Root"} {
		out := filepath.Join(dir, "refused-cert.pub")
		code, _, errOut := run(t, "ssh-cert", "--node", node, "--account", acc, "--public-key", pub, "--out", out)
		if code != 2 || !strings.Contains(errOut, "--account must be a Unix account name (^[a-z_][a-z0-9_-]{0,31}$)") {
			t.Fatalf("account %q: exit %d %s", acc, code, errOut)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Fatalf("account %q: wrote %s", acc, out)
		}
	}

	cert := filepath.Join(dir, "id-cert.pub")
	code, out, errOut := run(t, "ssh-cert", "--node", node, "--account", "ops", "--public-key", pub, "--out", cert, "--json")
	if code != 0 {
		t.Fatalf("ssh-cert: exit %d %s", code, errOut)
	}
	var got struct {
		Serial    string `json:"serial"`
		Principal string `json:"principal"`
		CommandID string `json:"command_id"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil || got.Principal != "ops@"+node || got.Serial == "" {
		t.Fatalf("ssh-cert --json: %v %s", err, out)
	}
	if c := e.WaitCommand(t, got.CommandID); c.State != wire.StateSucceeded {
		t.Fatalf("ssh.access: %s %s", c.State, c.Reason)
	}
	line, err := os.ReadFile(cert)
	if err != nil || !strings.HasPrefix(string(line), "ssh-ed25519-cert-v01@openssh.com ") {
		t.Fatalf("certificate file: %v %q", err, line)
	}

	code, out, errOut = run(t, "ssh-cert", "revoke", "--node", node, "--serial", got.Serial, "--json")
	var rv struct {
		CommandID string `json:"command_id"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &rv) != nil {
		t.Fatalf("revoke: exit %d %s %s", code, out, errOut)
	}
	if c := e.WaitCommand(t, rv.CommandID); c.State != wire.StateSucceeded {
		t.Fatalf("ssh.access: %s %s", c.State, c.Reason)
	}
	krl := filepath.Join(dir, "node.krl")
	if code, out, errOut := run(t, "ssh-cert", "krl", "--node", node, "--out", krl); code != 0 || !strings.Contains(out, "(1 revoked) written to "+krl) {
		t.Fatalf("krl: exit %d %s %s", code, out, errOut)
	}
	keygen, err := exec.LookPath("ssh-keygen")
	if err != nil {
		if os.Getenv("BC_REQUIRE_SSH") == "1" {
			t.Fatal("BC_REQUIRE_SSH=1 but ssh-keygen is missing")
		}
		return
	}
	q, _ := exec.Command(keygen, "-Q", "-f", krl, cert).CombinedOutput()
	if !strings.HasSuffix(string(q), ": REVOKED\n") {
		t.Fatalf("ssh-keygen -Q: %s", q)
	}
}
