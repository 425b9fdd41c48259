package cli_test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// Usage errors exit 2 with a message that names the flag or the count and
// never the value given: an unknown flag, a wrong argument count, a bad
// duration, a bad number.
func TestUsageErrorsExit2(t *testing.T) {
	t.Setenv("BC_ADDR", "http://127.0.0.1:1")
	t.Setenv("BC_API_KEY", "bck_x")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"nodes", "list", "--bogus"}, "error: better-compute nodes list: unknown flag --bogus (see better-compute nodes list --help)\n"},
		{[]string{"nodes", "list", "-z"}, "error: better-compute nodes list: unknown flag -z (see better-compute nodes list --help)\n"},
		{[]string{"commands", "show"}, "error: better-compute commands show: wrong arguments (0 given; see better-compute commands show --help)\n"},
		{[]string{"join-tokens", "create", "--ttl", "hunter2"}, "error: better-compute join-tokens create: --ttl: not a valid duration such as 90s, 10m or 2h (see better-compute join-tokens create --help)\n"},
		{[]string{"commands", "list", "--limit", "hunter2"}, "error: better-compute commands list: --limit: not a valid int (a whole number) (see better-compute commands list --help)\n"},
		{[]string{"commands", "run", "--node"}, "error: better-compute commands run: --node needs a value (see better-compute commands run --help)\n"},
	} {
		code, out, errOut := run(t, c.args...)
		if code != 2 || out != "" || errOut != c.want {
			t.Errorf("%v: exit %d, stderr %q, want 2 and %q", c.args, code, errOut, c.want)
		}
	}
}

// An address without a scheme and a PEM file given as the API key are
// refused (exit 2) with the fix; an API that is not running is named with
// the command that starts it (exit 1).
func TestClientSetupErrorsSayWhatToDo(t *testing.T) {
	t.Setenv("BC_API_KEY", "bck_x")
	t.Setenv("BC_ADDR", "127.0.0.1:7780")
	code, _, errOut := run(t, "nodes", "list")
	if want := "error: BC_ADDR \"127.0.0.1:7780\" has no scheme: write it as https://127.0.0.1:7780 (or http://127.0.0.1:7780 for a plain-HTTP loopback API)\n"; code != 2 || errOut != want {
		t.Fatalf("no scheme: exit %d: %q, want %q", code, errOut, want)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := "http://" + l.Addr().String()
	l.Close() // nothing listens there now
	t.Setenv("BC_ADDR", addr)
	code, _, errOut = run(t, "nodes", "list")
	if want := "error: cannot reach the API at " + addr + ": is `better-compute serve` (or `better-compute dev`) running, and is BC_ADDR its address?\n"; code != 1 || errOut != want {
		t.Fatalf("refused: exit %d: %q, want %q", code, errOut, want)
	}

	dir := t.TempDir()
	key, err := pki.NewNodeKey()
	if err != nil {
		t.Fatal(err)
	}
	pemKey, err := pki.MarshalPrivateKeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	kf := filepath.Join(dir, "node.key")
	if err := os.WriteFile(kf, pemKey, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("BC_API_KEY_FILE", kf)
	code, out, errOut := run(t, "nodes", "list")
	if want := "error: BC_API_KEY_FILE " + kf + " holds a PEM PRIVATE KEY, not an API key (an API key is one line starting bck_): point it at the file `better-compute api-keys create --out FILE` wrote, or at DATA/admin.key from `better-compute dev`\n"; code != 2 || errOut != want {
		t.Fatalf("PEM key: exit %d: %q, want %q", code, errOut, want)
	}
	if strings.Contains(out+errOut, "MII") {
		t.Fatal("the key material was printed")
	}
}

// API errors exit 1: ACCESS_DENIED names the action, the object and the
// next step; a wait that runs out names the flag to raise.
func TestAPIErrorsExit1AndSayWhatToDo(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	n := e.Join(t, pki.RoleNode, "idle") // never started: its commands stay queued
	t.Setenv("BC_ADDR", "http://"+e.CP.APIAddr)
	viewer := e.IdentityClient(t, iam.RootTenant, "v", "viewer")
	t.Setenv("BC_API_KEY", viewer.Key())
	code, _, errOut := run(t, "nodes", "revoke", n.NodeID())
	if want := "error: ACCESS_DENIED: compute:nodes:revoke on node " + n.NodeID() + " is not allowed: no role of yours allows it; ask an admin of tenant root for a role with compute:nodes:revoke\n"; code != 1 || errOut != want {
		t.Fatalf("viewer revokes: exit %d: %q, want %q", code, errOut, want)
	}
	t.Setenv("BC_API_KEY", e.AdminKey)
	code, _, errOut = run(t, "commands", "run", "--node", n.NodeID(), "--kind", "node.ping", "--wait", "--timeout", "1ns")
	if want := "error: better-compute commands run timed out after 1ns: raise --timeout (see better-compute commands run --help) [waiting for c"; code != 1 || !strings.HasPrefix(errOut, want) || !strings.Contains(errOut, "(follow it with `better-compute commands show c") {
		t.Fatalf("wait runs out: exit %d: %q, want prefix %q", code, errOut, want)
	}
}
