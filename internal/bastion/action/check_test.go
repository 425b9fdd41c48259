package action

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

// prog is a minimal valid program with inputs from urls.
func prog(urls ...string) Program {
	p := Program{Script: "true", Effects: []string{"out.txt"}}
	for i, u := range urls {
		p.Inputs = append(p.Inputs, Input{URL: u, As: fmt.Sprintf("in%d", i)})
	}
	return p
}

// TestCheckRefusesPrivateDestinations: on an unanchored machine a host
// written as a private, ULA, CGNAT, reserved, loopback or link-local
// address (also inside NAT64 or 6to4), this machine's address, or a
// localhost name, is refused when the op arrives.
func TestCheckRefusesPrivateDestinations(t *testing.T) {
	e := newEnv(t, testOpts{local: fakeLocal{netip.MustParseAddr("8.8.4.4"): true}})
	for _, host := range []string{"10.0.0.1", "192.168.1.1", "[fd00::1]", "100.64.0.1", "240.0.0.1",
		"[64:ff9b::a00:1]", "[2002:0a00:0001::]", "127.0.0.1", "localhost", "LocalHost.", "db.localhost",
		"169.254.169.254", "[fe80::1]", "[::ffff:10.0.0.1]", "0.0.0.0", "[::1]", "8.8.4.4", "[64:ff9b::808:404]"} {
		t.Run(host, func(t *testing.T) {
			wantReason(t, e.r.Check(prog("http://"+host+":8080/x")), ReasonDestinationPrivate)
		})
	}
	for _, u := range []string{"https://93.184.216.34/x", "http://[2606:2800:220:1:248:1893:25c8:1946]/", "https://example.com/a?b=c"} {
		if err := e.r.Check(prog(u)); err != nil {
			t.Errorf("Check(%s) = %v, want allowed", u, err)
		}
	}
}

// TestCheckAnchoredKeepsPrivate: an anchored machine allows private
// destinations but never loopback, link-local, metadata or this machine,
// also inside NAT64 or 6to4 (10.1.2.3 is this machine here).
func TestCheckAnchoredKeepsPrivate(t *testing.T) {
	e := newEnv(t, testOpts{anchored: true, local: fakeLocal{netip.MustParseAddr("10.1.2.3"): true}})
	for _, host := range []string{"10.0.0.1", "192.168.1.1", "[fd00::1]", "100.64.0.1", "[64:ff9b::a00:1]"} {
		if err := e.r.Check(prog("http://" + host + "/")); err != nil {
			t.Errorf("anchored Check(%s) = %v, want allowed", host, err)
		}
	}
	for _, host := range []string{"127.0.0.1", "[::1]", "localhost", "169.254.169.254", "100.100.100.200",
		"[fd00:ec2::254]", "[fe80::1]", "0.0.0.0", "[64:ff9b::7f00:1]", "[2002:7f00:1::]", "10.1.2.3", "[::ffff:127.0.0.1]",
		"[64:ff9b::a01:203]", "[2002:a01:203::]"} {
		t.Run(host, func(t *testing.T) {
			wantReason(t, e.r.Check(prog("http://"+host+"/")), ReasonDestinationPrivate)
		})
	}
}

// TestCheckRefusesMalformed: every shape rule of a program, by reason.
func TestCheckRefusesMalformed(t *testing.T) {
	e := newEnv(t, testOpts{})
	many := func(n int, f func(i int) string) []string {
		var out []string
		for i := range n {
			out = append(out, f(i))
		}
		return out
	}
	ok := Program{Script: "true", Effects: []string{"a.txt", "dir/b.txt"}, Inputs: []Input{{URL: "https://example.com/x", As: "x"}}}
	if err := e.r.Check(ok); err != nil {
		t.Fatalf("valid program refused: %v", err)
	}
	withEffects := func(effects ...string) Program { return Program{Script: "true", Effects: effects} }
	withInput := func(in ...Input) Program { return Program{Script: "true", Effects: []string{"a"}, Inputs: in} }
	cases := []struct {
		name   string
		p      Program
		reason string
	}{
		{"empty script", Program{Effects: []string{"a"}}, ReasonBadScript},
		{"long script", Program{Script: strings.Repeat("x", MaxScriptBytes+1), Effects: []string{"a"}}, ReasonBadScript},
		{"no effects", withEffects(), ReasonBadEffect},
		{"33 effects", withEffects(many(33, func(i int) string { return fmt.Sprint("f", i) })...), ReasonBadEffect},
		{"absolute", withEffects("/etc/passwd"), ReasonBadEffect},
		{"dotdot", withEffects("../x"), ReasonBadEffect},
		{"inner dotdot", withEffects("a/../b"), ReasonBadEffect},
		{"dot", withEffects("."), ReasonBadEffect},
		{"not clean", withEffects("a//b"), ReasonBadEffect},
		{"trailing slash", withEffects("a/"), ReasonBadEffect},
		{"agent", withEffects(".agent/notes"), ReasonBadEffect},
		{"inner agent", withEffects("x/.agent/y"), ReasonBadEffect},
		{"control", withEffects("a\x1b[2Jb"), ReasonBadEffect},
		{"backslash", withEffects(`a\..\b`), ReasonBadEffect},
		{"duplicate", withEffects("a", "a"), ReasonBadEffect},
		{"nested", withEffects("a", "a/b"), ReasonBadEffect},
		{"9 inputs", withInput(func() []Input {
			var in []Input
			for i := range 9 {
				in = append(in, Input{URL: "https://example.com/", As: fmt.Sprint("i", i)})
			}
			return in
		}()...), ReasonBadInput},
		{"ftp", withInput(Input{URL: "ftp://example.com/x", As: "x"}), ReasonBadInput},
		{"file", withInput(Input{URL: "file:///etc/passwd", As: "x"}), ReasonBadInput},
		{"no host", withInput(Input{URL: "http:///x", As: "x"}), ReasonBadInput},
		{"credentials", withInput(Input{URL: "https://u:p@example.com/", As: "x"}), ReasonBadInput},
		{"bad port", withInput(Input{URL: "https://example.com:0/", As: "x"}), ReasonBadInput},
		{"numeric name", withInput(Input{URL: "http://127.1/", As: "x"}), ReasonBadInput},
		{"hex name", withInput(Input{URL: "http://0x7f.0x1/", As: "x"}), ReasonBadInput},
		{"zone", withInput(Input{URL: "http://[fe80::1%25eth0]/", As: "x"}), ReasonBadInput},
		{"as path", withInput(Input{URL: "https://example.com/", As: "a/b"}), ReasonBadInput},
		{"as dotdot", withInput(Input{URL: "https://example.com/", As: ".."}), ReasonBadInput},
		{"as empty", withInput(Input{URL: "https://example.com/", As: ""}), ReasonBadInput},
		{"as twice", withInput(Input{URL: "https://example.com/", As: "x"}, Input{URL: "https://example.org/", As: "x"}), ReasonBadInput},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { wantReason(t, e.r.Check(c.p), c.reason) })
	}
}

// TestDigestIsCanonical: the digest is the SHA-256 of the changes sorted
// by path, in encoding/json; an empty list digests "[]".
func TestDigestIsCanonical(t *testing.T) {
	a := []Change{{Path: "b", Op: OpCreate, Size: 1, SHA256: "x"}, {Path: "a", Op: OpModify, Size: 2, SHA256: "y"}}
	b := []Change{a[1], a[0]}
	if Digest(a) != Digest(b) {
		t.Fatal("digest depends on order")
	}
	if Digest(nil) != sha256Hex([]byte("[]")) {
		t.Fatalf("empty digest %s", Digest(nil))
	}
	want := sha256Hex([]byte(`[{"path":"a","op":"modify","size":2,"sha256":"y"},{"path":"b","op":"create","size":1,"sha256":"x"}]`))
	if Digest(a) != want {
		t.Fatalf("digest %s, want %s", Digest(a), want)
	}
}
