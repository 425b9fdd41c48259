package cli

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/internal/bcdcli"
)

// A node (or tenant) names itself with terminal controls; the operator's
// nodes list, as a table, as JSON and in an error, carries none of them.
func TestServerTextCannotDriveTheTerminal(t *testing.T) {
	const name = "box\x1b]0;pwned\a\x1b[2J\u009b31m\x7f"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if strings.HasSuffix(r.URL.Path, "/nodes.revoke") {
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error":{"code":"NOT_FOUND","message":"node \u001b[2J\u009b not found"}}`))
			return
		}
		_, _ = w.Write([]byte(`{"nodes":[{"id":"n1","name":"box\u001b]0;pwned\u0007\u001b[2J\u009b31m\u007f","role":"node","state":"active"}]}`))
	}))
	defer srv.Close()
	t.Setenv("BC_ADDR", srv.URL)
	t.Setenv("BC_API_KEY", "bck_x")
	unsafe := func(r rune) bool { return r < 0x20 && r != '\n' && r != '\t' || r == 0x7f || r >= 0x80 && r <= 0x9f }
	for _, args := range [][]string{{"nodes", "list"}, {"nodes", "list", "--json"}, {"nodes", "revoke", "n1"}} {
		var out, errb bytes.Buffer
		Main(args, &out, &errb)
		for _, s := range []string{out.String(), errb.String()} {
			if strings.IndexFunc(s, unsafe) >= 0 {
				t.Errorf("%v printed a terminal control: %q", args, s)
			}
		}
		if args[1] == "list" && !strings.Contains(out.String(), "box") {
			t.Errorf("%v lost the name: %q", args, out.String())
		}
	}
	var out, errb bytes.Buffer
	Main([]string{"nodes", "list", "--json"}, &out, &errb)
	if !strings.Contains(out.String(), `\u009b`) || !strings.Contains(out.String(), `\u007f`) || !strings.Contains(out.String(), `\u001b`) {
		t.Fatalf("--json does not escape the controls: %q", out.String())
	}
	_ = name
}

// No command of either CLI quotes a positional argument back: an argument
// may be a token or a secret typed in the wrong place. Every command and
// group is run with five arguments (none takes five) and refused with
// exit 2, its output free of them.
func TestNoCommandEchoesAnArgument(t *testing.T) {
	t.Setenv("BC_ADDR", "http://127.0.0.1:1")
	t.Setenv("BC_API_KEY", "bck_x")
	t.Setenv("BCD_JOIN_TOKEN", "")
	secret := []string{"bcj1.secretA", "hunter2B", "secretC", "secretD", "secretE"}
	check := func(tool string, path []string, run func(args []string) (int, string)) {
		code, out := run(append(append([]string{}, path...), secret...))
		want := 2
		if tool == "better-compute" && strings.Join(path, " ") == "sandbox exec" {
			want = ExitCLIFailed // docker exec's status for its own failures
		}
		if code != want {
			t.Errorf("%s %v: exit %d, want %d: %s", tool, path, code, want, out)
		}
		for _, s := range secret {
			if strings.Contains(out, s) {
				t.Errorf("%s %v echoed an argument: %s", tool, path, out)
			}
		}
	}
	walk := func(tool string, root *cobra.Command, run func(args []string) (int, string)) int {
		n := 0
		var visit func(c *cobra.Command, path []string)
		visit = func(c *cobra.Command, path []string) {
			check(tool, path, run)
			n++
			for _, sub := range c.Commands() {
				visit(sub, append(append([]string{}, path...), sub.Name()))
			}
		}
		visit(root, nil)
		return n
	}
	n := walk("better-compute", NewRoot(), func(args []string) (int, string) {
		var out, errb bytes.Buffer
		code := Main(args, &out, &errb)
		return code, out.String() + errb.String()
	})
	n += walk("bcd", bcdcli.NewRoot(strings.NewReader("")), func(args []string) (int, string) {
		var out, errb bytes.Buffer
		code := bcdcli.Main(args, strings.NewReader(""), &out, &errb)
		return code, out.String() + errb.String()
	})
	if n < 40 {
		t.Fatalf("walked only %d commands", n)
	}
	// help on an unknown topic is refused the same way.
	var out, errb bytes.Buffer
	if code := Main([]string{"help", "hunter2"}, &out, &errb); code != 2 || strings.Contains(out.String()+errb.String(), "hunter2") {
		t.Fatalf("help: exit %d: %s%s", code, out.String(), errb.String())
	}
}
