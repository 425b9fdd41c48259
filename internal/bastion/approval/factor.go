package approval

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"time"

	"github.com/pquerna/otp"
	"github.com/pquerna/otp/totp"
	qrcode "github.com/skip2/go-qrcode"
)

// The second factor's parameters (RFC 6238 as authenticator apps read it).
const (
	// Issuer names this service in the otpauth:// URI.
	Issuer = "Better Compute"
	// CodePeriod is the TOTP step.
	CodePeriod = 30 * time.Second
	// CodeDigits is the length of a code.
	CodeDigits = 6
	// maxAccount is the longest account name Enroll takes.
	maxAccount = 64
)

// EnrollHint is the detail of a ReasonNotEnrolled refusal: how to enroll.
const EnrollHint = "no second factor is enrolled on this machine; run `bcd bastion enroll` on it"

// factorRecord is the plaintext of factor.sealed.
type factorRecord struct {
	V        int    `json:"v"`
	Bastion  string `json:"bastion"`
	Account  string `json:"account"`
	Secret   string `json:"secret"`    // base32, as in the otpauth:// URI
	LastStep int64  `json:"last_step"` // the last accepted TOTP step; 0 = none
}

// totpOpts are the validate options of every code here.
var totpOpts = totp.ValidateOpts{
	Period:    uint(CodePeriod / time.Second),
	Digits:    otp.DigitsSix,
	Algorithm: otp.AlgorithmSHA1,
}

// Enroll makes and seals a new TOTP secret for account and returns it once
// as an otpauth:// URI (show it, or QR of it, to the person; it is not
// shown again). A folder with a factor is refused ReasonAlreadyEnrolled;
// one whose factor file does not open, ReasonFactorDamaged.
func (s *Store) Enroll(account string) (string, error) {
	if !validAccount(account) {
		return "", fmt.Errorf("approval: account must be 1 to %d printable characters without ':'", maxAccount)
	}
	var uri string
	err := s.withLock(func() error {
		_, err := s.loadFactor()
		var re *RefusedError
		switch {
		case err == nil:
			return refuse(ReasonAlreadyEnrolled, "a second factor is already enrolled here")
		case !errors.As(err, &re) || re.Reason != ReasonNotEnrolled:
			return err
		}
		key, err := totp.Generate(totp.GenerateOpts{
			Issuer: Issuer, AccountName: account, Period: totpOpts.Period,
			SecretSize: 20, Digits: totpOpts.Digits, Algorithm: totpOpts.Algorithm,
		})
		if err != nil {
			return fmt.Errorf("approval: generate factor: %w", err)
		}
		rec := factorRecord{V: fileVersion, Bastion: s.bastion, Account: account, Secret: key.Secret()}
		if err := s.saveSealed(factorFile, purposeFactor, "factor", rec); err != nil {
			return err
		}
		uri = key.URL()
		return nil
	})
	return uri, err
}

// validAccount reports whether account is 1..maxAccount printable ASCII
// characters other than ':' (which the URI uses to split the issuer).
func validAccount(account string) bool {
	if account == "" || len(account) > maxAccount {
		return false
	}
	for i := 0; i < len(account); i++ {
		if c := account[i]; c < 0x20 || c > 0x7e || c == ':' {
			return false
		}
	}
	return true
}

// Enrolled reports whether a factor is enrolled here and opens.
func (s *Store) Enrolled() bool {
	_, err := s.loadFactor()
	return err == nil
}

// QR renders uri as a QR code in terminal text (half-height blocks).
func QR(uri string) (string, error) {
	q, err := qrcode.New(uri, qrcode.Medium)
	if err != nil {
		return "", fmt.Errorf("approval: qr: %w", err)
	}
	return q.ToSmallString(false), nil
}

// loadFactor reads factor.sealed: missing is ReasonNotEnrolled (with the
// hint), not opening or for another bastion is ReasonFactorDamaged.
func (s *Store) loadFactor() (factorRecord, error) {
	var f factorRecord
	ok, err := s.loadSealed(factorFile, purposeFactor, "factor", &f)
	var re *RefusedError
	switch {
	case !ok && err == nil:
		return f, refuse(ReasonNotEnrolled, EnrollHint)
	case errors.As(err, &re):
		return f, refuse(ReasonFactorDamaged, "the factor file does not open; remove factor.sealed and run `bcd bastion enroll` again")
	case err != nil:
		return f, err
	case f.V != fileVersion || f.Bastion != s.bastion || f.Secret == "":
		return f, refuse(ReasonFactorDamaged, "the factor file is not this bastion's")
	}
	return f, nil
}

// VerifyCode accepts a code of the enrolled factor for the steps now-1 to
// now+1 once: a code whose step is at or before the last accepted step is
// refused ReasonCodeReused, a wrong one ReasonCodeInvalid, and without a
// factor ReasonNotEnrolled (saying how to enroll). Every refusal also
// counts as a refused write (see WritesLocked).
func (s *Store) VerifyCode(code string) error {
	return s.withLock(func() error { return s.verifyLocked(code) })
}

// verifyLocked is VerifyCode with the lock held.
func (s *Store) verifyLocked(code string) error {
	err := s.checkCode(code)
	var re *RefusedError
	if errors.As(err, &re) {
		s.noteRefusedLocked()
	}
	return err
}

// checkCode is verifyLocked before noting a refusal.
func (s *Store) checkCode(code string) error {
	f, err := s.loadFactor()
	if err != nil {
		return err
	}
	if !wellFormedCode(code) {
		return refuse(ReasonCodeInvalid, "a code is 6 digits")
	}
	now := s.clock.Now().Unix()
	step := now / int64(totpOpts.Period)
	if now < 0 && now%int64(totpOpts.Period) != 0 {
		step-- // floor, as the code generator counts
	}
	matched, fresh := false, int64(0)
	for st := step + 1; st >= step-1; st-- {
		want, err := totp.GenerateCodeCustom(f.Secret, time.Unix(st*int64(totpOpts.Period), 0), totpOpts)
		if err != nil {
			return fmt.Errorf("approval: code: %w", err)
		}
		if subtle.ConstantTimeCompare([]byte(want), []byte(code)) == 1 {
			matched = true
			if st > f.LastStep && fresh == 0 {
				fresh = st
			}
		}
	}
	switch {
	case !matched:
		return refuse(ReasonCodeInvalid, "the code is not the factor's current code")
	case fresh == 0:
		return refuse(ReasonCodeReused, "that code was already used; wait for the next one")
	}
	f.LastStep = fresh
	return s.saveSealed(factorFile, purposeFactor, "factor", f)
}

// wellFormedCode reports whether code is exactly CodeDigits ASCII digits.
func wellFormedCode(code string) bool {
	if len(code) != CodeDigits {
		return false
	}
	for i := 0; i < len(code); i++ {
		if code[i] < '0' || code[i] > '9' {
			return false
		}
	}
	return true
}
