package ops

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxSummary bounds the summary shown to the person, in bytes: a longer
// one is refused (ReasonTooLarge), never clipped, since the person
// approves what the text shows.
const MaxSummary = 64 << 10

// Summary is the one-paragraph text shown to the person for an approval:
// the kind and its args rendered readably, with control and formatting
// characters (bidi overrides included) removed and a newline shown as
// " | ". It is deterministic and never clipped (ask refuses a summary
// longer than MaxSummary). extra (the action
// package's plan summary for action:apply) is appended.
func Summary(kind string, args any, extra string) string {
	var b strings.Builder
	b.WriteString(kind)
	switch a := args.(type) {
	case MovePlanArgs:
		fmt.Fprintf(&b, " in share %s:", a.Share)
		for _, m := range a.Moves {
			to := m.To
			if to == "" {
				to = "(archive)"
			}
			fmt.Fprintf(&b, " move %q to %q;", m.From, to)
		}
	case DryRunArgs:
		fmt.Fprintf(&b, " in share %s, may change %q", a.Share, a.Effects)
		for _, in := range a.Inputs {
			fmt.Fprintf(&b, ", fetches %q as %q", in.URL, in.As)
		}
		fmt.Fprintf(&b, "; script: %s", a.Script)
	case ApplyArgs:
		fmt.Fprintf(&b, " of plan %s with changes digest %s", a.Plan, a.Digest)
	case TerminalArgs:
		who := "the bastion's user"
		if a.Root {
			who = "root" // archtest:not-tenant (the superuser)
		}
		fmt.Fprintf(&b, " session %s as %s", a.Session, who)
	default:
		fmt.Fprintf(&b, " %+v", args)
	}
	if extra != "" {
		b.WriteString("; ")
		b.WriteString(extra)
	}
	return clean(b.String())
}

// clean removes control and formatting characters (a newline becomes
// " | ", invalid UTF-8 is dropped).
func clean(s string) string {
	var b strings.Builder
	for i, r := range s {
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD"):
			continue
		case r == '\n':
			b.WriteString(" | ")
		case r == '\t':
			b.WriteByte(' ')
		case unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp):
			continue
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// cleanClip is clean, clipped to max bytes on a character boundary and
// ended with "..." when clipped (details and names, never a summary).
func cleanClip(s string, max int) string {
	out := clean(s)
	if len(out) <= max {
		return out
	}
	cut := max - 3
	for cut > 0 && !utf8.RuneStart(out[cut]) {
		cut--
	}
	return out[:cut] + "..."
}
