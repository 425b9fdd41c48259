package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/sshca"
	"github.com/bettercompute/bettercompute/internal/sshca/sshdtest"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// TestSSHThroughTunnel: `better-compute ssh` (the built binary) makes a
// one-time key, gets a break-glass certificate, waits for the node to
// apply it, and logs in with the system ssh to a real sshd that reads the
// files bcd wrote, reached only through the tunnel over the node's own
// session (sshd listens on the node's loopback port on its allow list):
// the remote command's output and exit status come back. An account
// with shell characters is refused before anything is asked.
func TestSSHThroughTunnel(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	sshdtest.Require(t)
	me, err := user.Current()
	if err != nil || !sshca.ValidAccount(me.Username) {
		t.Fatalf("current account %v is not a valid account (%v)", me, err)
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "github.com/bettercompute/bettercompute/cmd/better-compute")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		base := sshdtest.StrictModesBase(t)
		work := filepath.Join(base, "work")
		if err := os.Mkdir(work, 0o700); err != nil {
			t.Fatal(err)
		}
		env := testenv.Start(t, db, testenv.Options{SSHDRoot: filepath.Join(base, "sshd")})
		joined := env.Join(t, pki.RoleNode, "")
		joined.Close()
		s := sshdtest.Start(t, work, joined.SSH.Dir)
		n := env.OpenNodeWith(t, joined.Dir, "", func(c *daemon.Config) { c.TunnelPorts = []uint32{uint32(s.Port)} })
		n.Start(t)
		n.WaitConnected(t)

		run := func(args ...string) (int, string, string) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, filepath.Join(bin, "better-compute"), args...)
			cmd.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C", "HOME=" + t.TempDir(), "BC_ADDR=" + env.APIURL(), "BC_API_KEY=" + env.AdminKey}
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			return code, stdout.String(), stderr.String()
		}
		node := n.NodeID()
		code, out, errOut := run("ssh", "--node", node, "--account", me.Username, "--port", itoa(s.Port), "--", "echo", "hello-from-the-node;", "exit", "3")
		if code != 3 || strings.TrimSpace(out) != "hello-from-the-node" {
			t.Fatalf("ssh: exit %d, stdout %q\n%s\nsshd:\n%s", code, out, errOut, s.Log.String())
		}
		if !strings.Contains(s.Log.String(), "Accepted publickey for "+me.Username) || !strings.Contains(s.Log.String(), "ED25519-CERT") || !strings.Contains(s.Log.String(), "account="+me.Username+" node="+node) {
			t.Fatalf("sshd did not log the certificate login:\n%s", s.Log.String())
		}
		code, _, errOut = run("ssh", "--node", node, "--account", "root;id", "--", "true")
		if code != 2 || !strings.Contains(errOut, "--account must be a Unix account name") {
			t.Fatalf("bad account: exit %d: %s", code, errOut)
		}
	})
}

func itoa(i int) string { return strconv.Itoa(i) }
