package bcdcli_test

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/bcdcli"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := bcdcli.Main(args, strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

// bcd's usage errors exit 2 and name the flag or the count, never the
// value given.
func TestUsageErrorsExit2(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"node", "--bogus"}, "error: bcd node: unknown flag --bogus (see bcd node --help)\n"},
		{[]string{"simulate", "--hold", "hunter2"}, "error: bcd simulate: --hold: not a valid duration such as 90s, 10m or 2h (see bcd simulate --help)\n"},
		{[]string{"simulate", "--nodes", "many"}, "error: bcd simulate: --nodes: not a valid int (a whole number) (see bcd simulate --help)\n"},
		{[]string{"join", "extra"}, "error: bcd join: wrong arguments (1 given; see bcd join --help)\n"},
	} {
		code, out, errOut := run(t, c.args...)
		if code != 2 || out != "" || errOut != c.want {
			t.Errorf("%v: exit %d, stderr %q, want 2 and %q", c.args, code, errOut, c.want)
		}
	}
}

// bcd join says what to do when the token is refused (used, expired or
// unknown: make a new one) and when the gateway cannot be reached; both
// exit 1.
func TestJoinErrorsSayWhatToDo(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	tok, err := e.CP.Nodes.CreateJoinToken(context.Background(), audit.Entry{TenantID: iam.RootTenant, Actor: "test"}, "node", "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("BCD_JOIN_TOKEN", tok.Token)
	if code, _, errOut := run(t, "join", "--gateway", e.CP.GatewayAddr, "--data", filepath.Join(t.TempDir(), "a"), "--name", "a"); code != 0 {
		t.Fatalf("first join: exit %d: %s", code, errOut)
	}
	code, _, errOut := run(t, "join", "--gateway", e.CP.GatewayAddr, "--data", filepath.Join(t.TempDir(), "b"), "--name", "b")
	if want := "error: the control plane refused the join token: it was already used, has expired, was revoked, or is unknown there (or the node name is not valid); make a new one with `better-compute join-tokens create` and run bcd join again\n"; code != 1 || errOut != want {
		t.Fatalf("used token: exit %d: %q, want %q", code, errOut, want)
	}
	if strings.Contains(errOut, tok.Token) {
		t.Fatal("the token was printed")
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	code, _, errOut = run(t, "join", "--gateway", addr, "--data", filepath.Join(t.TempDir(), "c"), "--name", "c")
	if want := "error: cannot reach the gateway at " + addr + ": is `better-compute serve` (with the gateway role) or `better-compute dev` running, and is --gateway its gateway address (host:port)? ("; code != 1 || !strings.HasPrefix(errOut, want) {
		t.Fatalf("no gateway: exit %d: %q, want prefix %q", code, errOut, want)
	}
}
