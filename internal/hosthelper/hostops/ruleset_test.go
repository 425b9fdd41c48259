package hostops

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
)

// egressRules is the table internal/daemon/sandbox's firewallRules
// loads (with its defaults filled in), the ruleset the helper must take.
const egressRules = `table inet bcsandbox
delete table inet bcsandbox
table inet bcsandbox {
	chain input {
		type filter hook input priority filter - 10; policy accept;
		iifname "bcs*" ip daddr 10.253.0.0/16 tcp dport 3128 accept
		iifname "bcs*" meta l4proto tcp reject with tcp reset
		iifname "bcs*" drop
	}
	chain forward {
		type filter hook forward priority filter - 10; policy accept;
		iifname "bcs*" drop
		oifname "bcs*" drop
	}
}
`

// TestCheckRulesetAccepts: the egress table as bcd loads it, and other
// commands on the owned table (sets and @references inside it, flush,
// add rule, delete, comments, ';' separators) pass.
func TestCheckRulesetAccepts(t *testing.T) {
	for _, s := range []string{
		egressRules,
		"flush table inet bcsandbox\n",
		"add rule inet bcsandbox input iifname \"bcs*\" drop # a comment with ruleset in it\n",
		"table inet bcsandbox { set allow { type ipv4_addr; elements = { 10.0.0.1, 10.0.0.2 } }; chain c { ip daddr @allow accept; jump d }; chain d { } }",
		"delete chain inet bcsandbox forward; add element inet bcsandbox allow { 10.0.0.3 }",
		"#!/usr/sbin/nft -f\n\n  \n",
		"",
	} {
		if err := CheckRuleset(s, DefaultOwned()); err != nil {
			t.Errorf("%q: %v", s, err)
		}
	}
}

// TestCheckRulesetRefuses: every way out of bcd's tables is refused
// with CodeRuleset: include/define/variables, the whole ruleset, another
// table or family (named or by default family ip), commands that are not
// on a table, statements glued after a block, "table" inside a block,
// tokens nft may read differently (backslash, quote, control, non-ASCII,
// strings over lines) and a script over 1 MiB.
func TestCheckRulesetRefuses(t *testing.T) {
	for _, s := range []string{
		`include "/etc/nftables.conf"`,
		"define x = 1\ntable inet bcsandbox { chain c { ip daddr $x drop } }",
		"table inet bcsandbox { chain c { ip daddr $x drop } }",
		"table inet bcsandbox { include \"/tmp/x\" }",
		"flush ruleset",
		"list ruleset",
		"flush\truleset",
		"table inet bcsandbox { }\nflush ruleset",
		"table inet bcsandbox;flush ruleset",
		"add rule inet bcsandbox input ,ruleset",
		"flush table ip filter",
		"delete table inet other",
		"add table inet other",
		"add table ip bcsandbox",
		"table bcsandbox { }",
		"flush table bcsandbox",
		"delete table inet handle 5",
		"add chain ip filter input { type filter hook input priority 0; policy drop; }",
		"add element ip filter s { 1.2.3.4 }",
		"list table inet bcsandbox",
		"monitor",
		"rename chain inet bcsandbox a b",
		"add ct helper inet bcsandbox h { type \"ftp\" protocol tcp; }",
		"inet bcsandbox input drop",
		"table inet bcsandbox { } delete table ip filter",
		"table inet bcsandbox { } add chain ip filter x",
		"table inet bcsandbox { chain c { } } table ip filter { }",
		"table inet bcsandbox { table ip filter { } }",
		"table inet \"bcsandbox\" { }",
		"\"x\"",
		"{ }",
		"}",
		"table inet bcsandbox {",
		"table inet bcsandbox { chain c { iifname \"a\nb\" drop } }",
		"table inet bcsandbox { chain c { iifname \"a\\\" drop } }",
		"table inet bcsandbox { chain c { iifname \"a",
		"table inet bcsandbox \\\n{ }",
		"table inet bcsandbox { chain c { iifname 'x' drop } }",
		"table inet bcsandbox\r\nflush table ip filter",
		"table inet bcsandbox { chain c { iifname é drop } }",
		"table inet bcsandbox\x00",
		"add",
		"add table",
		"table inet bcsandbox\n" + strings.Repeat("#", MaxRuleset),
	} {
		err := CheckRuleset(s, DefaultOwned())
		if r, ok := err.(*helperwire.Refusal); !ok || r.Code != helperwire.CodeRuleset {
			t.Errorf("%.80q: got %v, want %s", s, err, helperwire.CodeRuleset)
		}
	}
}

// TestCheckRulesetReasonNamesLine: a refusal names the offending token
// and its line.
func TestCheckRulesetReasonNamesLine(t *testing.T) {
	err := CheckRuleset("table inet bcsandbox { }\n\nflush table ip filter\n", DefaultOwned())
	wantCode(t, err, helperwire.CodeRuleset)
	if r := err.(*helperwire.Refusal); !strings.Contains(r.Reason, "line 3") || !strings.Contains(r.Reason, "ip filter") {
		t.Fatalf("reason %q names neither line nor table", r.Reason)
	}
}

// nftOrSkip skips unless nft can run here (root, nftables).
func nftOrSkip(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if err := exec.Command(DefaultNFT, "list", "tables").Run(); err != nil {
		t.Skipf("nft does not work here: %v", err)
	}
}

// TestApplyRuleset: with a test table as the owned one, a script on it
// is loaded by the real nft and listed after; a script naming another
// table is refused before nft runs (that table never appears); a script
// nft itself rejects is CodeFailed and changes nothing.
func TestApplyRuleset(t *testing.T) {
	nftOrSkip(t)
	name := fmt.Sprintf("bchostopstest%d", os.Getpid())
	other := name + "x"
	o := &Ops{Owned: []Table{{Family: "inet", Name: name}}}
	t.Cleanup(func() {
		exec.Command(DefaultNFT, "delete", "table", "inet", name).Run()
		exec.Command(DefaultNFT, "delete", "table", "inet", other).Run()
	})
	ctx := context.Background()
	check := exec.Command(DefaultNFT, "-c", "-f", "-") // nft's own parser takes the egress table as CheckRuleset does
	check.Stdin = strings.NewReader(egressRules)
	if out, err := check.CombinedOutput(); err != nil {
		t.Fatalf("nft -c refuses the egress table: %s %v", out, err)
	}
	script := fmt.Sprintf("table inet %[1]s\ndelete table inet %[1]s\ntable inet %[1]s {\n\tchain c {\n\t\tiifname \"bcs*\" drop\n\t}\n}\n", name)
	if err := o.ApplyRuleset(ctx, script); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(DefaultNFT, "list", "table", "inet", name).CombinedOutput(); err != nil || !strings.Contains(string(out), "chain c") {
		t.Fatalf("table not loaded: %s %v", out, err)
	}
	wantCode(t, o.ApplyRuleset(ctx, fmt.Sprintf("table inet %s { }\n", other)), helperwire.CodeRuleset)
	if err := exec.Command(DefaultNFT, "list", "table", "inet", other).Run(); err == nil {
		t.Fatal("a refused script's table exists")
	}
	wantCode(t, o.ApplyRuleset(ctx, fmt.Sprintf("table inet %s { chain c { nosuchkeyword } }\n", name)), helperwire.CodeFailed)
	if err := o.ApplyRuleset(ctx, fmt.Sprintf("delete table inet %s\n", name)); err != nil {
		t.Fatal(err)
	}
}

// FuzzCheckRuleset: CheckRuleset never panics, and a script it accepts,
// read again token by token, names only owned tables wherever the word
// table (or a statement's object) appears, holds no variable and no
// include, define or ruleset, and starts every top-level statement with
// a command.
func FuzzCheckRuleset(f *testing.F) {
	owned := DefaultOwned()
	f.Fuzz(func(t *testing.T, script string) {
		if CheckRuleset(script, owned) != nil {
			return
		}
		toks, err := tokenize(script)
		if err != nil {
			t.Fatalf("accepted but does not tokenize: %v", err)
		}
		for i, tok := range toks {
			if tok.str {
				continue
			}
			if strings.Contains(tok.text, "$") {
				t.Fatalf("accepted a variable: %q", tok.text)
			}
			for _, r := range identRuns(tok.text) {
				if slices.Contains(forbidden, r) {
					t.Fatalf("accepted %q", r)
				}
			}
			if tok.text == "table" {
				assertOwnedAfter(t, toks[i+1:], owned)
			}
		}
	})
}

// assertOwnedAfter fails unless the words after "table" name an owned
// table ([family] name, family ip by default).
func assertOwnedAfter(t *testing.T, rest []token, owned []Table) {
	t.Helper()
	tb := Table{Family: "ip"}
	if len(rest) > 0 && slices.Contains(families, rest[0].text) && !rest[0].str {
		tb.Family, rest = rest[0].text, rest[1:]
	}
	if len(rest) == 0 || rest[0].str || !slices.Contains(owned, Table{Family: tb.Family, Name: rest[0].text}) {
		t.Fatalf("accepted a foreign table after %q", tb.Family)
	}
}
