package share

import (
	"strings"
	"testing"
)

// FuzzMatcher: any patterns (one a line) and any path never panic, and a
// path with a ".agent" component, or under one, is always excluded.
func FuzzMatcher(f *testing.F) {
	f.Add("secret\n.config/gcloud", "a/b/.config/gcloud/x")
	f.Add("*.pem", "keys/a.pem")
	f.Add("", ".agent")
	f.Add("[", "x")
	f.Add("a/*/c", "x/a/b/c/d")
	f.Fuzz(func(t *testing.T, patterns, rel string) {
		m, err := NewMatcher(strings.Split(patterns, "\n"))
		if err != nil {
			wantReason(t, err, ReasonPatternInvalid)
			if m, err = NewMatcher(nil); err != nil {
				t.Fatal(err)
			}
		}
		m.Excluded(rel)
		for _, p := range []string{".agent/" + rel, rel + "/.agent", rel + "/.agent/x", ".AGENT"} {
			if !m.Excluded(p) {
				t.Fatalf("Excluded(%q) = false", p)
			}
		}
		if c, err := cleanRel(rel); err == nil && inAgent(splitRel(c)) && !m.Excluded(c) {
			t.Fatalf("cleaned %q not excluded", c)
		}
	})
}

// FuzzCleanRel: an accepted path is relative, holds no ".." component and
// no NUL, is at most 4096 bytes, and is its own cleaning.
func FuzzCleanRel(f *testing.F) {
	for _, s := range []string{"", "a/b", "../x", "a/../b", "/etc/passwd", `a\..\b`, "C:x", "a..b/c", "./a//b/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		c, err := cleanRel(p)
		if err != nil {
			wantReason(t, err, ReasonPathInvalid)
			return
		}
		if strings.HasPrefix(c, "/") || strings.HasPrefix(c, `\`) || hasVolume(c) || strings.ContainsRune(c, 0) || len(c) > 4096 {
			t.Fatalf("cleanRel(%q) = %q", p, c)
		}
		for _, comp := range strings.FieldsFunc(c, func(r rune) bool { return r == '/' || r == '\\' }) {
			if comp == ".." {
				t.Fatalf("cleanRel(%q) = %q holds ..", p, c)
			}
		}
		if again, err := cleanRel(c); err != nil || again != c {
			t.Fatalf("cleanRel(%q) = %q, again %q, %v", p, c, again, err)
		}
	})
}
