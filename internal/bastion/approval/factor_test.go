package approval

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pquerna/otp"
)

func TestEnrollURIComputesAcceptedCodes(t *testing.T) {
	f := newFixture(t)
	if f.s.Enrolled() {
		t.Fatal("enrolled before Enroll")
	}
	uri := f.enroll(t)
	key, err := otp.NewKeyFromURL(uri)
	must(t, err)
	if !strings.HasPrefix(uri, "otpauth://totp/") || key.Period() != 30 || key.Digits() != otp.DigitsSix ||
		key.Algorithm() != otp.AlgorithmSHA1 || key.Issuer() != Issuer || key.AccountName() != "alice@laptop" {
		t.Fatalf("uri %q: period %d digits %v alg %v issuer %q", uri, key.Period(), key.Digits(), key.Algorithm(), key.Issuer())
	}
	if !f.s.Enrolled() || !f.open(t).Enrolled() {
		t.Fatal("not enrolled after Enroll")
	}
	// The previous step's code, then this step's, then the next step's: each once.
	now := f.clk.Now()
	for _, at := range []time.Time{now.Add(-CodePeriod), now, now.Add(CodePeriod)} {
		if err := f.s.VerifyCode(f.codeAt(t, at)); err != nil {
			t.Fatalf("code for %v at %v: %v", at, now, err)
		}
	}
	// Two steps ahead or behind is not accepted.
	f.clk.Advance(5 * CodePeriod)
	now = f.clk.Now()
	wantRefused(t, f.s.VerifyCode(f.codeAt(t, now.Add(2*CodePeriod))), ReasonCodeInvalid)
	wantRefused(t, f.s.VerifyCode(f.codeAt(t, now.Add(-2*CodePeriod))), ReasonCodeInvalid)
	wantRefused(t, f.s.VerifyCode("12345"), ReasonCodeInvalid)
	wantRefused(t, f.s.VerifyCode("12345a"), ReasonCodeInvalid)
	_, err = f.s.Enroll("mallory")
	wantRefused(t, err, ReasonAlreadyEnrolled)
	if q, err := QR(uri); err != nil || !strings.Contains(q, "█") {
		t.Fatalf("QR: %v %q", err, q)
	}
}

func TestCodeReusedRefused(t *testing.T) {
	f := newFixture(t)
	f.enroll(t)
	now := f.clk.Now()
	c := f.codeAt(t, now)
	must(t, f.s.VerifyCode(c))
	wantRefused(t, f.s.VerifyCode(c), ReasonCodeReused)
	// Later within the same step, and from another Store on the folder.
	f.clk.Advance(10 * time.Second)
	wantRefused(t, f.open(t).VerifyCode(c), ReasonCodeReused)

	// A newer step's code, then an older step's: the older one is refused.
	f.clk.Advance(3 * CodePeriod)
	now = f.clk.Now()
	must(t, f.s.VerifyCode(f.codeAt(t, now.Add(CodePeriod))))
	wantRefused(t, f.s.VerifyCode(f.codeAt(t, now)), ReasonCodeReused)
	wantRefused(t, f.s.VerifyCode(f.codeAt(t, now.Add(-CodePeriod))), ReasonCodeReused)
}

func TestNotEnrolledRefusedWithHint(t *testing.T) {
	f := newFixture(t)
	re := wantRefused(t, f.s.VerifyCode("123456"), ReasonNotEnrolled)
	if !strings.Contains(re.Detail, "bcd bastion enroll") || !strings.Contains(re.Error(), "bcd bastion enroll") {
		t.Fatalf("refusal does not say how to enroll: %v", re)
	}
	r, err := f.s.Ask("files:move-plan", digestOf("files:move-plan", "{}"), "move")
	must(t, err)
	wantRefused(t, f.s.Approve(r.ID, "123456"), ReasonNotEnrolled)
	_, err = f.s.GrantStanding("files:move-plan", t0, t0.Add(time.Hour), 1, 1, "123456")
	wantRefused(t, err, ReasonNotEnrolled)
	wantRefused(t, f.s.GiveRootGrant(t0.Add(time.Hour), "123456"), ReasonNotEnrolled)
	must(t, f.s.Anchor())
	wantRefused(t, f.s.Unanchor("123456"), ReasonNotEnrolled)
}

func TestFactorFileDamaged(t *testing.T) {
	f := newFixture(t)
	f.enroll(t)
	b := f.readFile(t, factorFile)
	b[len(b)-1] ^= 1
	f.writeFile(t, factorFile, b)
	if f.s.Enrolled() {
		t.Fatal("a damaged factor counts as enrolled")
	}
	wantRefused(t, f.s.VerifyCode(f.codeAt(t, f.clk.Now())), ReasonFactorDamaged)
	_, err := f.s.Enroll("mallory")
	wantRefused(t, err, ReasonFactorDamaged)
}

func TestFactorFromAnotherBastionRefused(t *testing.T) {
	for name, other := range map[string]struct {
		key []byte
		id  string
	}{
		"other key":        {[]byte("another bastion's key bytes....!"), "bastion-1"},
		"other bastion id": {testSecret, "bastion-2"},
	} {
		t.Run(name, func(t *testing.T) {
			a, b := newFixture(t), newFixture(t)
			b.keyIn, b.bid = other.key, other.id
			b.s = b.open(t)
			b.enroll(t)
			must(t, os.WriteFile(filepath.Join(a.dir, factorFile), b.readFile(t, factorFile), 0o600))
			if a.s.Enrolled() {
				t.Fatal("a factor copied from another bastion counts as enrolled")
			}
			a.totp = b.totp
			wantRefused(t, a.s.VerifyCode(a.codeAt(t, a.clk.Now())), ReasonFactorDamaged)
		})
	}
}
