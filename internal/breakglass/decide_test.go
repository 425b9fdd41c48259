package breakglass

import (
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/sshca"
)

// TestNotAfter: the default and longest validity is an hour, a request
// outside 0 to 3600 s is refused by its reason, and the end is never past
// the caller's credential.
func TestNotAfter(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	for _, c := range []struct {
		name       string
		seconds    int64
		credential time.Time
		want       time.Time
		refused    bool
	}{
		{"default", 0, time.Time{}, now.Add(time.Hour), false},
		{"shorter", 600, time.Time{}, now.Add(10 * time.Minute), false},
		{"max", 3600, time.Time{}, now.Add(time.Hour), false},
		{"over an hour", 3601, time.Time{}, time.Time{}, true},
		{"negative", -1, time.Time{}, time.Time{}, true},
		{"credential first", 0, now.Add(5 * time.Minute), now.Add(5 * time.Minute), false},
		{"credential later", 600, now.Add(2 * time.Hour), now.Add(10 * time.Minute), false},
	} {
		got, err := notAfter(now, c.seconds, c.credential)
		if c.refused {
			if err == nil || errs.CodeOf(err) != errs.InvalidInput || errs.SafeMessage(err) != ReasonValidityInvalid+": validity_seconds must be 1 to 3600 (0: 3600)" {
				t.Errorf("%s: %v, want %s", c.name, err, ReasonValidityInvalid)
			}
			continue
		}
		if err != nil || !got.Equal(c.want) {
			t.Errorf("%s: %v %v, want %v", c.name, got, err, c.want)
		}
	}
}

// TestNeedsDelivery: a first state, changed accounts and every revocation
// are delivered; the same accounts again are not.
func TestNeedsDelivery(t *testing.T) {
	last := &sshca.Access{Accounts: []string{"a", "b"}}
	for _, c := range []struct {
		name     string
		last     *sshca.Access
		accounts []string
		revoked  bool
		want     bool
	}{
		{"first", nil, []string{"a"}, false, true},
		{"same", last, []string{"a", "b"}, false, false},
		{"added", last, []string{"a", "b", "c"}, false, true},
		{"dropped", last, []string{"a"}, false, true},
		{"revoked, same accounts", last, []string{"a", "b"}, true, true},
	} {
		if got := needsDelivery(c.last, c.accounts, c.revoked); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
