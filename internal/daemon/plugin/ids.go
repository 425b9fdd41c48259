package plugin

import (
	"errors"
	"hash/fnv"
	"os/user"
	"regexp"
	"slices"
	"strconv"
)

// The block of uids and gids bcd keeps for plugins: clear of system users,
// systemd's DynamicUser range and the usual container ranges.
const (
	IDBase uint32 = 0x7FFE0000
	IDSize uint32 = 0x10000
)

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)

// ValidName reports whether name is a plugin name: a lower-case letter,
// then up to 31 lower-case letters, digits and dashes. Names end up in
// cgroup paths and logs, so nothing else is allowed.
func ValidName(name string) bool { return nameRE.MatchString(name) }

// AssignIDs gives each named plugin its own id (used as both uid and gid)
// from the block IDBase..IDBase+IDSize-1. Each name starts at a slot
// derived from its FNV-1a hash and probes forward past an id taken (for
// which taken reports true: an existing account or group) or already given
// to another plugin. Names are assigned in sorted order, so the result
// depends only on the set of names and the accounts, not on the order they
// are listed in, and stays the same across restarts.
func AssignIDs(names []string, taken func(uint32) bool) (map[string]uint32, error) {
	sorted := slices.Clone(names)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	out := make(map[string]uint32, len(sorted))
	used := make(map[uint32]bool, len(sorted))
	for _, name := range sorted {
		if !ValidName(name) {
			return nil, refuse(CodeNameInvalid, nil)
		}
		h := fnv.New32a()
		h.Write([]byte(name))
		start := h.Sum32() % IDSize
		found := false
		for i := uint32(0); i < IDSize; i++ {
			id := IDBase + (start+i)%IDSize
			if used[id] || taken(id) {
				continue
			}
			out[name], used[id], found = id, true, true
			break
		}
		if !found {
			return nil, refuse(CodeIDsExhausted, errors.New("no free id in the plugin block"))
		}
	}
	return out, nil
}

// AccountTaken reports whether id is already a user's uid or a group's
// gid on this host (os/user), the default for AssignIDs' taken. A lookup
// that fails for another reason than "unknown" counts as taken, so bcd
// never shares an id it could not check.
func AccountTaken(id uint32) bool {
	s := strconv.FormatUint(uint64(id), 10)
	if _, err := user.LookupId(s); !errors.As(err, new(user.UnknownUserIdError)) {
		return true
	}
	if _, err := user.LookupGroupId(s); !errors.As(err, new(user.UnknownGroupIdError)) {
		return true
	}
	return false
}
