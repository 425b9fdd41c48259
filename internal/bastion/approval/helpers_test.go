package approval

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pquerna/otp"
	"github.com/pquerna/otp/totp"

	"github.com/bettercompute/bettercompute/internal/clock"
)

// t0 is the fixtures' start time: 15 s into a TOTP step.
var t0 = time.Date(2026, 12, 2, 10, 0, 15, 0, time.UTC)

// testSecret is the bastion key bytes of the default fixture.
var testSecret = bytes.Repeat([]byte{0x42}, 32)

// fixture is one bastion's data folder with a fake clock.
type fixture struct {
	dir   string
	clk   *clock.Fake
	s     *Store
	totp  string // the enrolled factor's base32 secret ("" before enroll)
	bid   string
	keyIn []byte
}

// newFixture opens a store on a fresh folder.
func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{dir: filepath.Join(t.TempDir(), "data"), clk: clock.NewFake(t0), bid: "bastion-1", keyIn: testSecret}
	f.s = f.open(t)
	return f
}

// open returns another Store on f's folder (as a second process would).
func (f *fixture) open(t *testing.T) *Store {
	t.Helper()
	s, err := OpenStore(Config{Dir: f.dir, Secret: f.keyIn, BastionID: f.bid, Clock: f.clk})
	if err != nil {
		t.Fatalf("OpenStore: %v", err)
	}
	return s
}

// enroll enrolls a factor and keeps its secret, read from the URI.
func (f *fixture) enroll(t *testing.T) string {
	t.Helper()
	uri, err := f.s.Enroll("alice@laptop")
	if err != nil {
		t.Fatalf("Enroll: %v", err)
	}
	key, err := otp.NewKeyFromURL(uri)
	if err != nil {
		t.Fatalf("parse %q: %v", uri, err)
	}
	f.totp = key.Secret()
	return uri
}

// codeAt is the factor's code at time at.
func (f *fixture) codeAt(t *testing.T, at time.Time) string {
	t.Helper()
	c, err := totp.GenerateCode(f.totp, at)
	if err != nil {
		t.Fatalf("GenerateCode: %v", err)
	}
	return c
}

// fresh moves the clock on one step and returns the code for then, so
// that it was never accepted before.
func (f *fixture) fresh(t *testing.T) string {
	t.Helper()
	f.clk.Advance(CodePeriod)
	return f.codeAt(t, f.clk.Now())
}

// wrongCode returns a well-formed code that matches none of now-1..now+1.
func (f *fixture) wrongCode(t *testing.T) string {
	t.Helper()
	now := f.clk.Now()
	bad := map[string]bool{}
	for d := -1; d <= 1; d++ {
		bad[f.codeAt(t, now.Add(time.Duration(d)*CodePeriod))] = true
	}
	for _, c := range []string{"000000", "111111", "222222", "333333"} {
		if !bad[c] {
			return c
		}
	}
	t.Fatal("no wrong code")
	return ""
}

// wantRefused fails unless err is a refusal with reason.
func wantRefused(t *testing.T, err error, reason string) *RefusedError {
	t.Helper()
	var r interface{ RefusalReason() string }
	if !errors.As(err, &r) {
		t.Fatalf("got %v, want refusal %q", err, reason)
	}
	if r.RefusalReason() != reason {
		t.Fatalf("got refusal %q (%v), want %q", r.RefusalReason(), err, reason)
	}
	var re *RefusedError
	errors.As(err, &re)
	return re
}

// must fails the test on err.
func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// digestOf is Digest of op over args given as a string.
func digestOf(op, args string) string { return Digest(op, []byte(args)) }

// readFile returns a file of the folder.
func (f *fixture) readFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(f.dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// writeFile replaces a file of the folder (as a hand edit would).
func (f *fixture) writeFile(t *testing.T, name string, b []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(f.dir, name), b, 0o600); err != nil {
		t.Fatal(err)
	}
}
