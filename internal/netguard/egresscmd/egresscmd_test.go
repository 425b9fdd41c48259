package egresscmd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

type fakeResolver map[string][]string

func (f fakeResolver) LookupNetIP(_ context.Context, _ string, host string) ([]netip.Addr, error) {
	ans, ok := f[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	out := make([]netip.Addr, len(ans))
	for i, a := range ans {
		out[i] = netip.MustParseAddr(a)
	}
	return out, nil
}

type noLocal struct{}

func (noLocal) IsLocal(context.Context, netip.Addr) (bool, string, error) { return false, "", nil }

var testDeps = deps{
	resolver: fakeResolver{
		"example.com":      {"93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"},
		"internal.example": {"8.8.8.8", "10.0.0.7"},
	},
	local: noLocal{},
}

func runCheck(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := newEgressCommand(testDeps)
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(append([]string{"check"}, args...))
	err := cmd.ExecuteContext(context.Background())
	return out.String(), errOut.String(), ExitCode(err)
}

// TestCheckCommandExitCodes: 0 allowed, 3 refused, 2 bad input, 1 lookup
// failure, with the verdict and reason printed per address.
func TestCheckCommandExitCodes(t *testing.T) {
	cases := []struct {
		args     []string
		code     int
		contains []string
	}{
		{[]string{"example.com"}, 0, []string{"example.com: allowed", "93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"}},
		{[]string{"8.8.8.8"}, 0, []string{"8.8.8.8: allowed"}},
		{[]string{"10.0.0.1"}, 3, []string{"10.0.0.1: refused (private)"}},
		{[]string{"internal.example"}, 3, []string{"internal.example: refused (private)", "8.8.8.8", "allowed", "10.0.0.7", "refused (private)"}},
		{[]string{"LocalHost."}, 3, []string{"refused (localhost-name)"}},
		{[]string{"169.254.169.254"}, 3, []string{"refused (link-local)"}},
		{[]string{"[::ffff:127.0.0.1]"}, 3, []string{"refused (loopback)"}},
		{[]string{"--allow-lan", "10.0.0.0/8", "10.0.0.1"}, 0, []string{"allowed", "[allow list]"}},
		{[]string{"--allow-lan", "internal.example", "internal.example"}, 0, []string{"internal.example: allowed"}},
	}
	for _, tc := range cases {
		out, errOut, code := runCheck(t, tc.args...)
		if code != tc.code {
			t.Errorf("check %v: exit %d, want %d (out %q err %q)", tc.args, code, tc.code, out, errOut)
		}
		for _, s := range tc.contains {
			if !strings.Contains(out, s) {
				t.Errorf("check %v: output %q lacks %q", tc.args, out, s)
			}
		}
	}
	for _, args := range [][]string{{}, {"a", "b"}, {"exa mple.com"}, {"[fe80::1%eth0]"}, {"--bogus", "x"}, {"--allow-lan", "10.0.0.0/33", "x"}} {
		if _, errOut, code := runCheck(t, args...); code != 2 || !strings.Contains(errOut, "error:") {
			t.Errorf("check %v: exit %d stderr %q, want 2 with a message", args, code, errOut)
		}
	}
	if _, _, code := runCheck(t, "nxdomain.example"); code != ExitFailure {
		t.Errorf("check nxdomain: exit %d, want %d", code, ExitFailure)
	}
}

// TestCheckCommandJSON: --json prints the verdict and reason per address.
func TestCheckCommandJSON(t *testing.T) {
	out, _, code := runCheck(t, "--json", "internal.example")
	if code != ExitRefused {
		t.Fatalf("exit %d", code)
	}
	var got checkJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("json: %v\n%s", err, out)
	}
	want := checkJSON{Target: "internal.example", Verdict: "refused", Reason: "private", Addresses: []addrJSON{
		{Address: "8.8.8.8", Verdict: "allowed"},
		{Address: "10.0.0.7", Verdict: "refused", Reason: "private"},
	}}
	if got.Target != want.Target || got.Verdict != want.Verdict || got.Reason != want.Reason || len(got.Addresses) != 2 ||
		got.Addresses[0] != want.Addresses[0] || got.Addresses[1] != want.Addresses[1] {
		t.Fatalf("json = %+v, want %+v", got, want)
	}
}

// TestExitCode maps errors to exit codes.
func TestExitCode(t *testing.T) {
	if ExitCode(nil) != 0 || ExitCode(errors.New("x")) != 1 || ExitCode(&ExitError{Code: 3}) != 3 {
		t.Fatal("ExitCode mapping broken")
	}
	wrapped := errors.Join(errors.New("ctx"), &ExitError{Code: 2})
	if ExitCode(wrapped) != 2 {
		t.Fatal("ExitCode does not unwrap")
	}
}

// TestProxyCommandServesAndStops: egress-proxy listens, refuses a private
// target with 403 naming the reason, and returns when its context ends.
func TestProxyCommandServesAndStops(t *testing.T) {
	addrc := make(chan net.Addr, 1)
	d := testDeps
	d.onListen = func(a net.Addr) { addrc <- a }
	cmd := newProxyCommand(d)
	var errOut bytes.Buffer
	cmd.SetOut(io.Discard)
	cmd.SetErr(&errOut)
	cmd.SetArgs([]string{"--listen", "127.0.0.1:0", "--allow-lan", "192.168.0.0/16"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	addr := <-addrc
	c, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "CONNECT internal.example:443 HTTP/1.1\r\nHost: internal.example:443\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusForbidden || string(body) != "refused: private\n" {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("egress-proxy returned %v", err)
	}
	if !strings.Contains(errOut.String(), `"msg":"egress connection"`) || !strings.Contains(errOut.String(), `"reason":"private"`) {
		t.Fatalf("log lacks the connection line: %s", errOut.String())
	}
}

// TestProxyCommandBadInput: a malformed allow entry or argument exits 2.
func TestProxyCommandBadInput(t *testing.T) {
	for _, args := range [][]string{{"--allow-lan", "not a host"}, {"extra"}, {"--nope"}} {
		cmd := newProxyCommand(testDeps)
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		cmd.SetArgs(args)
		if code := ExitCode(cmd.ExecuteContext(context.Background())); code != ExitBadInput {
			t.Errorf("egress-proxy %v: exit %d, want %d", args, code, ExitBadInput)
		}
	}
}

// TestPublicConstructors: the exported constructors build the commands the
// lead wires into bcd.
func TestPublicConstructors(t *testing.T) {
	e := NewEgressCommand()
	if e.Name() != "egress" || len(e.Commands()) != 1 || e.Commands()[0].Name() != "check" {
		t.Fatalf("egress command shape: %s %v", e.Name(), e.Commands())
	}
	if p := NewProxyCommand(); p.Name() != "egress-proxy" || p.Flags().Lookup("listen") == nil || p.Flags().Lookup("allow-lan") == nil {
		t.Fatalf("egress-proxy command shape")
	}
}
