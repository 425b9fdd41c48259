package cli

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/internal/jsontime"
)

// timeText renders t as the API answers times (jsontime.Layout: RFC 3339
// in UTC with milliseconds); "-" for the zero time.
func timeText(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return jsontime.Format(t)
}

// sizeText renders a byte count for a table: exact below 1 KiB, else in
// the largest binary unit with one decimal ("1.5 GiB"). --json keeps the
// exact number.
func sizeText(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// cellText renders one value of a list answer in a table column: times
// (columns ending in _at) as timeText, sizes (columns ending in _bytes or
// _mb) human-readable, whole numbers without an exponent.
func cellText(col string, v any) string {
	switch x := v.(type) {
	case string:
		if strings.HasSuffix(col, "_at") {
			if t, err := time.Parse(time.RFC3339Nano, x); err == nil {
				return timeText(t)
			}
		}
		return x
	case float64:
		if x != math.Trunc(x) || math.Abs(x) > 1<<53 {
			return fmt.Sprint(x)
		}
		return cellText(col, int64(x))
	case int64:
		switch {
		case strings.HasSuffix(col, "_bytes") && x >= 0:
			return sizeText(x)
		case strings.HasSuffix(col, "_mb") && x >= 0 && x < 1<<43:
			return sizeText(x << 20)
		}
		return fmt.Sprint(x)
	}
	return fmt.Sprint(v)
}

// hiddenAlias returns a hidden command name that runs c with c's flags: an
// old name kept working (`sandbox get` for `sandbox show`) without being
// shown.
func hiddenAlias(c *cobra.Command, name string) *cobra.Command {
	a := &cobra.Command{Use: name + strings.TrimPrefix(c.Use, c.Name()), Short: c.Short, Args: c.Args, RunE: c.RunE, Hidden: true}
	a.Flags().AddFlagSet(c.Flags())
	return a
}
