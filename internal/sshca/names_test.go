package sshca

import (
	"strings"
	"testing"
)

// TestValidAccount: Unix account names only; nothing ssh reads as an
// option, nothing that expands in %r/%u, nothing that leaves the
// principals directory or splits the principal.
func TestValidAccount(t *testing.T) {
	for _, s := range []string{"alice", "_svc", "a", "deploy-bot", "u_1", strings.Repeat("a", 32)} {
		if !ValidAccount(s) {
			t.Errorf("ValidAccount(%q) = false, want true", s)
		}
	}
	for _, s := range []string{
		"", "-oProxyCommand=sh", "-", "1alice", "Alice", "alice%u", "%r", "a b", "a\tb", "a@b", "a,b",
		"a/b", "..", ".", "a.b", "a$", "a\nb", "a;b", "a'b", `a"b`, "é", strings.Repeat("a", 33),
	} {
		if ValidAccount(s) {
			t.Errorf("ValidAccount(%q) = true, want false", s)
		}
	}
}

// TestValidHost: a DNS host name or an IP address only. Option-looking,
// user@host, host:port, zoned, bracketed and numeric-but-not-dotted-quad
// spellings are refused.
func TestValidHost(t *testing.T) {
	for _, s := range []string{
		"localhost", "node-1.example.com", "EXAMPLE.com", "a", "3com", "x.3com", "127.0.0.1", "10.1.2.3",
		"::1", "2001:db8::1", "::ffff:127.0.0.1", strings.Repeat("a", 63) + ".com",
	} {
		if !ValidHost(s) {
			t.Errorf("ValidHost(%q) = false, want true", s)
		}
	}
	for _, s := range []string{
		"", "-oProxyCommand=sh", "-host", "host-", "root@host", "host:22", "[::1]", "fe80::1%eth0", "%h",
		"a b", "a\tb", "host\n", `"host"`, "'host'", "a/b", "a_b", "a..b", ".host", "host.", "a,b",
		"127.1", "0x7f.1", "0x7f000001", "2130706433", "1.2.3", "01.2.3.4", "127.0.0.1.", "256.1.1.1",
		"\u00e9xample.com", strings.Repeat("a", 64) + ".com", strings.Repeat("a.", 127) + "com",
	} {
		if ValidHost(s) {
			t.Errorf("ValidHost(%q) = true, want false", s)
		}
	}
}
