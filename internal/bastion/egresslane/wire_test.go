package egresslane

import (
	"bytes"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
)

// jobSeeds are the job lines the fuzz corpus starts from (also checked
// by TestDecodeJob).
var jobSeeds = map[string]bool{ // line → accepted
	`{"v":1,"target":"example.com:443"}`:                  true,
	`{"target":"example.com:443","v":1}`:                  true,
	`{"v":1,"target":"93.184.215.14:80"}`:                 true,
	`{"v":1,"target":"[2001:db8::1]:443"}`:                true,
	`{"v":1,"target":"[::ffff:10.0.0.1]:80"}`:             true,
	`{"v":1,"target":"xn--bcher-kva.example.:65535"}`:     true,
	`{"v":1,"target":"a_b.example:1"}`:                    true,
	` {"v":1,"target":"example.com:443"} `:                true,
	`{"v":1,"target":"example.com"}`:                      false,
	`{"v":1,"target":"example.com:0"}`:                    false,
	`{"v":1,"target":"example.com:65536"}`:                false,
	`{"v":1,"target":"example.com:+80"}`:                  false,
	`{"v":1,"target":"::1:80"}`:                           false,
	`{"v":1,"target":"[fe80::1%25eth0]:80"}`:              false,
	`{"v":1,"target":"[10.0.0.1]:80"}`:                    false,
	`{"v":1,"target":"bücher.example:80"}`:                false,
	`{"v":1,"target":"a..b:80"}`:                          false,
	`{"v":1,"target":"example.com:80\u0000"}`:             false,
	`{"v":1,"target":"example.com:80","target":"x:1"}`:    false,
	`{"v":1,"target":"example.com:80","extra":true}`:      false,
	`{"V":1,"target":"example.com:80"}`:                   false,
	`{"v":1e0,"target":"example.com:80"}`:                 false,
	`{"v":1,"target":["example.com:80"]}`:                 false,
	`{"v":1,"target":"example.com:80"}{"v":1}`:            false,
	`{"v":1,"target":"example.com:80"`:                    false,
	`null`:                                                false,
	"{\"v\":1,\"target\":\"example.com:80\xff\"}":         false,
	`{"v":1,"target":"` + strings.Repeat("a", 300) + `"}`: false,
}

func TestDecodeJob(t *testing.T) {
	for line, ok := range jobSeeds {
		target, err := decodeJob([]byte(line))
		if (err == nil) != ok {
			t.Errorf("decodeJob(%.60q) = %q, %v; accepted want %v", line, target, err, ok)
		}
	}
}

func TestDecodeVerdict(t *testing.T) {
	good := map[string]verdict{
		`{"ok":true}`:                      {OK: true},
		`{"ok":false,"reason":"busy"}`:     {Reason: "busy"},
		`{"reason":"loopback","ok":false}`: {Reason: "loopback"},
	}
	for line, want := range good {
		if v, err := decodeVerdict([]byte(line)); err != nil || v != want {
			t.Errorf("decodeVerdict(%s) = %+v, %v", line, v, err)
		}
	}
	for _, line := range []string{`{"ok":false}`, `{"ok":false,"reason":""}`, `{"ok":false,"reason":"A"}`,
		`{"ok":false,"reason":"-x"}`, `{"ok":true,"reason":"busy"}`, `{"ok":1}`, `{}`, `{"ok":true,"ok":true}`} {
		if v, err := decodeVerdict([]byte(line)); err == nil {
			t.Errorf("decodeVerdict(%s) = %+v, want an error", line, v)
		}
	}
}

// FuzzJobLine feeds the job decoder arbitrary lines: it never panics, and
// an accepted job names a valid host:port that survives a round trip.
func FuzzJobLine(f *testing.F) {
	for line := range jobSeeds {
		f.Add([]byte(line))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		target, err := decodeJob(line)
		if err != nil {
			return
		}
		checkTarget(t, target)
		var buf bytes.Buffer
		if err := writeLine(&buf, job{V: 1, Target: target}); err != nil {
			t.Fatalf("re-encode %q: %v", target, err)
		}
		again, err := decodeJob(bytes.TrimSuffix(buf.Bytes(), []byte("\n")))
		if err != nil || again != target {
			t.Fatalf("round trip %q: %q, %v", target, again, err)
		}
	})
}

// checkTarget checks an accepted target independently of ValidTarget.
func checkTarget(t *testing.T, target string) {
	t.Helper()
	host, port, err := net.SplitHostPort(target)
	if err != nil {
		t.Fatalf("accepted %q: %v", target, err)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
		t.Fatalf("accepted %q with port %q", target, port)
	}
	if strings.HasPrefix(target, "[") {
		a, err := netip.ParseAddr(host)
		if err != nil || !a.Is6() || a.Zone() != "" {
			t.Fatalf("accepted %q: bracketed host %q is not a zoneless IPv6 address", target, host)
		}
		return
	}
	if host == "" || len(host) > 254 || strings.Trim(host, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_") != "" {
		t.Fatalf("accepted %q: host %q has characters outside a name or IPv4 address", target, host)
	}
	if strings.Contains(host, "..") || strings.HasPrefix(host, ".") {
		t.Fatalf("accepted %q: empty label", target)
	}
}

// FuzzVerdictLine feeds the CP's verdict decoder arbitrary lines (a
// bastion's bytes): it never panics, and a refusal it accepts carries a
// short lowercase reason.
func FuzzVerdictLine(f *testing.F) {
	for _, s := range []string{`{"ok":true}`, `{"ok":false,"reason":"busy"}`, `{"ok":false,"reason":"Busy"}`,
		`{"ok":false}`, `{"ok":true,"reason":"x"}`, `{"ok":false,"reason":"a\nb"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		v, err := decodeVerdict(line)
		if err != nil {
			return
		}
		if v.OK && v.Reason != "" {
			t.Fatalf("ok verdict with reason %q", v.Reason)
		}
		if !v.OK && (len(v.Reason) == 0 || len(v.Reason) > maxReason || strings.Trim(v.Reason, "abcdefghijklmnopqrstuvwxyz0123456789-") != "") {
			t.Fatalf("refusal with reason %q", v.Reason)
		}
	})
}
