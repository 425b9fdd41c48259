package share

import (
	"path"
	"strings"
)

// Limits on paths and patterns.
const (
	// maxPath is the longest path (in bytes) an op may name.
	maxPath = 4096
	// maxPatterns is the most exclude patterns a share may hold.
	maxPatterns = 64
	// maxPattern is the longest one pattern may be, in bytes.
	maxPattern = 1024
)

// agentFolder is the local search agent's folder, excluded at any depth
// whatever the patterns. It is compared without regard to case, so a
// case-insensitive file system cannot open it under another spelling.
const agentFolder = ".agent"

// Matcher decides whether a path inside a share is excluded.
type Matcher struct {
	patterns [][]string // each pattern split into its components
	source   []string   // the patterns as validated, for storing
}

// NewMatcher validates patterns and returns their matcher. A pattern is
// one name, or names joined by "/" (one trailing "/" is dropped); each
// name is a path.Match glob. It refuses (ReasonPatternInvalid) an empty
// pattern, a leading "/", a "..", "." or empty component, a NUL, a
// malformed glob, and more than maxPatterns patterns.
func NewMatcher(patterns []string) (*Matcher, error) {
	if len(patterns) > maxPatterns {
		return nil, refuse(ReasonPatternInvalid, "more than 64 patterns")
	}
	m := &Matcher{source: []string{}}
	for _, p := range patterns {
		comps, err := splitPattern(p)
		if err != nil {
			return nil, err
		}
		m.patterns = append(m.patterns, comps)
		m.source = append(m.source, strings.Join(comps, "/"))
	}
	return m, nil
}

// splitPattern validates one pattern and splits it into components.
func splitPattern(p string) ([]string, error) {
	trimmed := strings.TrimSuffix(p, "/")
	if trimmed == "" || len(p) > maxPattern || strings.HasPrefix(p, "/") || strings.ContainsRune(p, 0) {
		return nil, refuse(ReasonPatternInvalid, p)
	}
	comps := strings.Split(trimmed, "/")
	for _, c := range comps {
		if c == "" || c == "." || c == ".." {
			return nil, refuse(ReasonPatternInvalid, p)
		}
		if _, err := path.Match(c, ""); err != nil {
			return nil, refuse(ReasonPatternInvalid, p)
		}
	}
	return comps, nil
}

// normalised returns the validated patterns, as a share stores them.
func (m *Matcher) normalised() []string { return append([]string{}, m.source...) }

// Excluded reports whether rel, a slash path inside the share, is
// excluded: some component is ".agent", a one-name pattern matches some
// component, or a pattern with "/" matches some run of consecutive
// components. Empty and "." components are skipped; rel is not cleaned
// (cleaning could drop a ".agent/.." and so hide it).
func (m *Matcher) Excluded(rel string) bool {
	comps := splitRel(rel)
	if inAgent(comps) {
		return true
	}
	for _, p := range m.patterns {
		if matchRun(p, comps) {
			return true
		}
	}
	return false
}

// inAgent reports whether a component is ".agent" (in any case).
func inAgent(comps []string) bool {
	for _, c := range comps {
		if strings.EqualFold(c, agentFolder) {
			return true
		}
	}
	return false
}

// matchRun reports whether pattern p matches len(p) consecutive
// components of comps, anywhere. Names are compared case-folded: on a
// case-insensitive file system ".SSH" opens ".ssh", so an exclude holds
// for every spelling (stricter, never looser, on a case-sensitive one).
func matchRun(p, comps []string) bool {
	for i := 0; i+len(p) <= len(comps); i++ {
		all := true
		for j, pc := range p {
			if ok, _ := path.Match(strings.ToLower(pc), strings.ToLower(comps[i+j])); !ok {
				all = false
				break
			}
		}
		if all {
			return true
		}
	}
	return false
}

// splitRel splits a slash path into its components, leaving out empty and
// "." ones.
func splitRel(rel string) []string {
	var out []string
	for _, c := range strings.Split(rel, "/") {
		if c != "" && c != "." {
			out = append(out, c)
		}
	}
	return out
}

// cleanRel validates a path an op names and returns it cleaned ("." for
// the top of the share). It refuses (ReasonPathInvalid) a path longer
// than maxPath, holding a NUL, absolute (a leading "/" or "\", or a
// volume name), or with a ".." component (split on "/" and "\", so a
// Windows separator cannot hide one).
func cleanRel(p string) (string, error) {
	if len(p) > maxPath || strings.ContainsRune(p, 0) ||
		strings.HasPrefix(p, "/") || strings.HasPrefix(p, `\`) || hasVolume(p) {
		return "", refuse(ReasonPathInvalid, p)
	}
	for _, c := range strings.FieldsFunc(p, func(r rune) bool { return r == '/' || r == '\\' }) {
		if c == ".." {
			return "", refuse(ReasonPathInvalid, p)
		}
	}
	// Cleaning can bring a backslash or a drive letter to the front
	// (`./\x` cleans to `\x`), so the cleaned form is checked too.
	c := path.Clean(p)
	if strings.HasPrefix(c, `\`) || hasVolume(c) {
		return "", refuse(ReasonPathInvalid, p)
	}
	return c, nil
}

// hasVolume reports whether p starts with a drive letter and a colon
// ("C:"), which Windows reads as absolute or drive-relative.
func hasVolume(p string) bool {
	return len(p) >= 2 && p[1] == ':' &&
		(('a' <= p[0] && p[0] <= 'z') || ('A' <= p[0] && p[0] <= 'Z'))
}
