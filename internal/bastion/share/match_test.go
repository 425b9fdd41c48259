package share

import (
	"fmt"
	"strings"
	"testing"
)

// TestMatcher: one name at any depth, a run of names at any depth, globs
// within a component, and .agent whatever the patterns.
func TestMatcher(t *testing.T) {
	m, err := NewMatcher([]string{"secret", ".config/gcloud", "*.pem", "node_modules/"})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		rel  string
		want bool
	}{
		{"secret", true},
		{"a/b/c/secret", true}, // one name at depth 3
		{"a/b/c/secret/d", true},
		{"a/secretive", false},
		{"a/b/.config/gcloud/x", true},
		{".config/gcloud", true},
		{".config/other", false},
		{".config", false},
		{"gcloud", false},
		{"a/.config/x/gcloud", false},
		{"keys/server.pem", true},
		{"x/node_modules/y", true},
		{".agent", true},
		{"a/.agent/b", true},
		{"a/.Agent", true},
		{"SECRET", true}, // excludes hold for every spelling
		{"a/.Config/GCloud/x", true},
		{"keys/SERVER.PEM", true},
		{"a/b/c", false},
		{"", false},
		{".", false},
	}
	for _, c := range cases {
		if got := m.Excluded(c.rel); got != c.want {
			t.Errorf("Excluded(%q) = %v, want %v", c.rel, got, c.want)
		}
	}
	none, err := NewMatcher(nil)
	if err != nil || !none.Excluded("x/.agent/y") || none.Excluded("x/y") {
		t.Fatalf("no patterns: %v", err)
	}
}

// TestNewMatcherRefuses: each malformed pattern, and one too many.
func TestNewMatcherRefuses(t *testing.T) {
	for _, p := range []string{"", "/", "/abs", "a/../b", "..", "a/./b", ".", "a//b", "x\x00", "[", "a/[b", strings.Repeat("a", 1025)} {
		_, err := NewMatcher([]string{"ok", p})
		wantReason(t, err, ReasonPatternInvalid)
	}
	many := make([]string, 65)
	for i := range many {
		many[i] = fmt.Sprint("p", i)
	}
	_, err := NewMatcher(many)
	wantReason(t, err, ReasonPatternInvalid)
	if _, err := NewMatcher(many[:64]); err != nil {
		t.Fatalf("64 patterns: %v", err)
	}
}

// TestCleanRel: what the path validator accepts and returns.
func TestCleanRel(t *testing.T) {
	ok := map[string]string{"": ".", ".": ".", "a//b/": "a/b", "./a": "a", "a..b": "a..b", "..a/b": "..a/b"}
	for in, want := range ok {
		if got, err := cleanRel(in); err != nil || got != want {
			t.Errorf("cleanRel(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"/a", `\a`, "C:x", "c:/x", "a/..", "../a", `a\..\b`, "a\x00", strings.Repeat("x", 4097)} {
		_, err := cleanRel(in)
		wantReason(t, err, ReasonPathInvalid)
	}
}
