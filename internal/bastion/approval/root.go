package approval

import (
	"time"
)

// rootRecord is the plaintext of root-grant.sealed.
type rootRecord struct {
	V       int       `json:"v"`
	Bastion string    `json:"bastion"`
	Until   time.Time `json:"until"`
}

// anchorRecord is the plaintext of anchor.sealed.
type anchorRecord struct {
	V        int       `json:"v"`
	Bastion  string    `json:"bastion"`
	Anchored bool      `json:"anchored"`
	At       time.Time `json:"at"`
}

// GiveRootGrant verifies code (as VerifyCode: it needs an enrolled factor)
// and then records a root command grant until until, which must be in the
// future and at most MaxWindow away (ReasonBadWindow). It replaces any
// grant before.
func (s *Store) GiveRootGrant(until time.Time, code string) error {
	return s.withLock(func() error {
		if err := s.verifyLocked(code); err != nil {
			return err
		}
		now := s.clock.Now()
		if !until.After(now) || until.Sub(now) > MaxWindow {
			return refuse(ReasonBadWindow, "a root grant ends in the future, at most 30 days from now")
		}
		return s.saveSealed(rootFile, purposeRoot, "root-grant", rootRecord{V: fileVersion, Bastion: s.bastion, Until: until})
	})
}

// RevokeRootGrant ends the root command grant (none is no error).
func (s *Store) RevokeRootGrant() error {
	return s.withLock(func() error { return s.remove(rootFile) })
}

// RootGrant returns when the root command grant ends and whether it holds
// now. A record that does not open, is another bastion's, or has ended
// holds no grant.
func (s *Store) RootGrant() (until time.Time, ok bool) {
	var r rootRecord
	found, err := s.loadSealed(rootFile, purposeRoot, "root-grant", &r)
	if !found || err != nil || r.V != fileVersion || r.Bastion != s.bastion || !r.Until.After(s.clock.Now()) {
		return time.Time{}, false
	}
	return r.Until, true
}

// Anchor records that a fleet owns this machine. The caller checks that
// it runs as root; this package only records.
func (s *Store) Anchor() error {
	return s.withLock(func() error {
		rec := anchorRecord{V: fileVersion, Bastion: s.bastion, Anchored: true, At: s.clock.Now()}
		return s.saveSealed(anchorFile, purposeAnchor, "anchor", rec)
	})
}

// Unanchor verifies code (as VerifyCode) and then removes the anchor mark.
// The caller checks that it runs as root.
func (s *Store) Unanchor(code string) error {
	return s.withLock(func() error {
		if err := s.verifyLocked(code); err != nil {
			return err
		}
		return s.remove(anchorFile)
	})
}

// Anchored reports whether the anchor mark is recorded and opens.
func (s *Store) Anchored() bool {
	var r anchorRecord
	found, err := s.loadSealed(anchorFile, purposeAnchor, "anchor", &r)
	return found && err == nil && r.V == fileVersion && r.Bastion == s.bastion && r.Anchored
}
