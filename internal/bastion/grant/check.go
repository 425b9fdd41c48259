package grant

import (
	"fmt"
	"slices"

	"github.com/bettercompute/bettercompute/internal/ids"
)

// check returns the reason d is refused for on its own (everything but
// bastion and time), and a message naming the field; "" if it is well
// formed. Shape faults (ReasonMalformed) are reported before unknown
// families.
func check(d Doc) (Reason, string) {
	if d.V != Version {
		return ReasonMalformed, fmt.Sprintf("v is %d, want %d", d.V, Version)
	}
	if !validID(d.ID) {
		return ReasonMalformed, "id must be 1 to 64 characters of [a-z0-9_-]"
	}
	if !ids.ValidName(d.Bastion) {
		return ReasonMalformed, "bastion: " + ids.NameRule
	}
	if d.IssuedAt <= 0 || d.ExpiresAt <= d.IssuedAt {
		return ReasonMalformed, "issued_at_ms must be positive and before expires_at_ms"
	}
	lists := []struct {
		name  string
		items []string
		max   int
		valid func(string) bool
	}{
		{"allow", d.Allow, len(Families()), nonEmpty},
		{"deny", d.Deny, len(Families()), nonEmpty},
		{"models", d.Models, MaxModels, validModel},
		{"reach", d.Reach, MaxReach, validServer},
	}
	for _, l := range lists {
		if msg := checkList(l.name, l.items, l.max, l.valid); msg != "" {
			return ReasonMalformed, msg
		}
	}
	for _, f := range append(slices.Clone(d.Allow), d.Deny...) {
		if !knownFamily(f) {
			return ReasonUnknownFamily, fmt.Sprintf("unknown family %q", f)
		}
	}
	return "", ""
}

// checkList checks one list field: at most max items, each valid, none
// twice.
func checkList(name string, items []string, max int, valid func(string) bool) string {
	if len(items) > max {
		return fmt.Sprintf("%s has %d items, at most %d", name, len(items), max)
	}
	seen := make(map[string]bool, len(items))
	for i, s := range items {
		if !valid(s) {
			return fmt.Sprintf("%s[%d] is not valid", name, i)
		}
		if seen[s] {
			return fmt.Sprintf("%s[%d] repeats an item", name, i)
		}
		seen[s] = true
	}
	return ""
}

func nonEmpty(s string) bool { return s != "" && len(s) <= 64 }

// validID reports whether s is a grant id: 1..64 of [a-z0-9_-].
func validID(s string) bool {
	if s == "" || len(s) > MaxIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// validModel reports whether s is a model name a grant may carry: 1..128
// bytes of printable ASCII other than space.
func validModel(s string) bool {
	if s == "" || len(s) > MaxModelLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// validServer reports whether s is a service-slot server name:
// [a-z0-9][a-z0-9-]{0,62}.
func validServer(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '-') {
			return false
		}
	}
	return true
}
