package cli_test

import (
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// Shell completion (cobra's __complete) offers the ids and names the
// caller can see, for arguments and flags; with no API it offers nothing
// and prints no error (only cobra's own note on stderr, which the shell
// scripts discard).
func TestCompletion(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	n := e.Join(t, pki.RoleNode, "gpu-07")
	t.Setenv("BC_ADDR", "http://"+e.CP.APIAddr)
	t.Setenv("BC_API_KEY", e.AdminKey)
	code, out, errOut := run(t, "__complete", "nodes", "revoke", "gpu")
	if want := "gpu-07\t" + n.NodeID() + "\n:4\n"; code != 0 || out != want {
		t.Fatalf("complete nodes revoke gpu: exit %d: %q (want %q) %s", code, out, want, errOut)
	}
	code, out, _ = run(t, "__complete", "commands", "run", "--node", n.NodeID()[:3])
	if !strings.Contains(out, n.NodeID()+"\tgpu-07\n") || code != 0 {
		t.Fatalf("complete --node: exit %d: %q", code, out)
	}
	code, out, _ = run(t, "__complete", "tenants", "suspend", "")
	if code != 0 || !strings.HasSuffix(out, ":4\n") {
		t.Fatalf("complete tenants suspend: exit %d: %q", code, out)
	}
	const quiet = "Completion ended with directive: ShellCompDirectiveNoFileComp\n"
	t.Setenv("BC_ADDR", "http://127.0.0.1:1")
	code, out, errOut = run(t, "__complete", "nodes", "revoke", "")
	if code != 0 || out != ":4\n" || errOut != quiet {
		t.Fatalf("complete with no API: exit %d: %q %q", code, out, errOut)
	}
	t.Setenv("BC_ADDR", "")
	if code, out, errOut = run(t, "__complete", "secrets", "show", ""); code != 0 || out != ":4\n" || errOut != quiet {
		t.Fatalf("complete with no BC_ADDR: exit %d: %q %q", code, out, errOut)
	}
}
