package sshca

import (
	"bytes"
	"net/netip"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/bettercompute/bettercompute/internal/errs"
)

// accountRE is the account rule as the issue states it, the oracle for
// FuzzValidAccount.
var accountRE = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

// FuzzValidAccount: ValidAccount agrees with the stated regular
// expression on every input. Seeds: testdata/fuzz/FuzzValidAccount.
func FuzzValidAccount(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := ValidAccount(s), accountRE.MatchString(s); got != want {
			t.Fatalf("ValidAccount(%q) = %v, regexp says %v", s, got, want)
		}
	})
}

// FuzzValidHost: whatever ValidHost accepts is at most 253 bytes, never
// starts with '-', has none of the bytes that make it something else to
// ssh or a resolver, and is either an unzoned IP address (':' only then)
// or dot-separated LDH labels whose last is not numeric. Seeds:
// testdata/fuzz/FuzzValidHost.
func FuzzValidHost(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string) {
		if !ValidHost(s) {
			return
		}
		if len(s) > MaxHostLen || strings.HasPrefix(s, "-") {
			t.Fatalf("ValidHost(%q): too long or starts with '-'", s)
		}
		if i := strings.IndexAny(s, " \t\r\n\x00@%'\"`\\/[]#,;$=_"); i >= 0 {
			t.Fatalf("ValidHost(%q) accepted %q", s, s[i])
		}
		if a, err := netip.ParseAddr(s); err == nil {
			if a.Zone() != "" {
				t.Fatalf("ValidHost(%q) accepted a zone", s)
			}
			return
		}
		if strings.Contains(s, ":") {
			t.Fatalf("ValidHost(%q): ':' outside an IPv6 literal", s)
		}
		labels := strings.Split(s, ".")
		for _, l := range labels {
			if !validLabel(l) {
				t.Fatalf("ValidHost(%q): bad label %q", s, l)
			}
		}
		if numericLabel(labels[len(labels)-1]) {
			t.Fatalf("ValidHost(%q): numeric last label", s)
		}
	})
}

// FuzzParsePublicKey: the request's key parsing never panics; a refusal is
// INVALID_INPUT with one of the key reasons; an accepted key is one line,
// not a certificate, of an accepted type, and round-trips through
// ssh.MarshalAuthorizedKey. Seeds: testdata/fuzz/FuzzParsePublicKey.
func FuzzParsePublicKey(f *testing.F) {
	reasons := []string{ReasonKeyMalformed, ReasonKeyIsCertificate, ReasonKeyTypeRefused, ReasonKeyTooWeak}
	f.Fuzz(func(t *testing.T, line []byte) {
		key, err := ParsePublicKey(line)
		if err != nil {
			msg := errs.SafeMessage(err)
			if errs.CodeOf(err) != errs.InvalidInput || !hasReason(msg, reasons) {
				t.Fatalf("refusal %v has no key reason", err)
			}
			return
		}
		body := bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
		if bytes.ContainsAny(body, "\r\n\x00") {
			t.Fatalf("accepted more than one line: %q", line)
		}
		if _, isCert := key.(*ssh.Certificate); isCert {
			t.Fatalf("accepted a certificate: %q", line)
		}
		if checkKeyType(key) != nil {
			t.Fatalf("accepted a refused key type %s", key.Type())
		}
		again, err := ParsePublicKey(ssh.MarshalAuthorizedKey(key))
		if err != nil || !bytes.Equal(again.Marshal(), key.Marshal()) {
			t.Fatalf("accepted key does not round-trip: %v", err)
		}
	})
}

// hasReason reports whether msg starts with one of reasons and ": ".
func hasReason(msg string, reasons []string) bool {
	for _, r := range reasons {
		if strings.HasPrefix(msg, r+": ") {
			return true
		}
	}
	return false
}
