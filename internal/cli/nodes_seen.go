package cli

import "time"

// lastSeenCell renders a node's last Hello for a table: RFC 3339 with
// milliseconds in UTC, or "-" for a node never seen.
func lastSeenCell(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return timeText(*t)
}

// nodeVersionCell is a node's bcd version, or "-" when it never said.
func nodeVersionCell(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
