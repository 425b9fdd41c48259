package checkpoint

import (
	"path"
	"strings"
)

// Bounds on names, as Linux has them (PATH_MAX, NAME_MAX).
const (
	maxNameBytes    = 4096
	maxElementBytes = 255
)

// checkName returns the canonical relative name of a tar entry, or the
// refusal: an absolute name, a ".." element, or a name that is empty, not
// canonical (empty or "." elements, "./" prefixes), holds a NUL or a
// backslash, or is over the length bounds. A directory's name may end in
// one "/", as tar writes it.
func checkName(n string, isDir bool) (string, error) {
	raw := n
	if isDir {
		n = strings.TrimSuffix(n, "/")
	}
	if strings.HasPrefix(n, "/") {
		return "", refuse(ReasonAbsolutePath, "entry %q", raw)
	}
	els := strings.Split(n, "/")
	for _, el := range els {
		if el == ".." {
			return "", refuse(ReasonDotDot, "entry %q", raw)
		}
	}
	if n == "" || len(n) > maxNameBytes || strings.ContainsAny(n, "\x00\\") {
		return "", refuse(ReasonBadName, "entry %q is empty, too long, or holds a NUL or backslash", raw)
	}
	for _, el := range els {
		if el == "" || el == "." || len(el) > maxElementBytes {
			return "", refuse(ReasonBadName, "entry %q is not canonical", raw)
		}
	}
	return n, nil
}

// linkEscapes reports whether a symbolic link at name (canonical) with
// target could resolve above the root, or has a target that is empty,
// holds a NUL or is over the length bound. An absolute target is read as
// rooted in the sandbox, as the sandbox's processes read it; a relative
// one starts at the link's directory. A ".." is allowed only before every
// other element and no more times than the link is deep: a ".." after a
// name could climb out of wherever that name (itself a link) led, which
// no lexical check can bound ("l -> ." then "d/m -> ../l/.."), so it is
// refused, and then every link in a chain stays in the root.
func linkEscapes(name, target string) bool {
	if target == "" || len(target) > maxNameBytes || strings.IndexByte(target, 0) >= 0 {
		return true
	}
	depth := 0
	if !strings.HasPrefix(target, "/") {
		if d := path.Dir(name); d != "." {
			depth = strings.Count(d, "/") + 1
		}
	}
	named := false
	for _, el := range strings.Split(target, "/") {
		switch el {
		case "", ".":
		case "..":
			depth--
			if depth < 0 || named {
				return true
			}
		default:
			named = true
		}
	}
	return false
}

// digestHex returns the hex of a "sha256:<64 lower-case hex>" digest, or a
// ReasonBadDigest refusal; only such a string ever becomes part of a key
// or is compared with a computed digest.
func digestHex(d string) (string, error) {
	h, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(h) != 64 {
		return "", refuse(ReasonBadDigest, "digest %q is not sha256:<64 hex>", d)
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return "", refuse(ReasonBadDigest, "digest %q is not sha256:<64 hex>", d)
		}
	}
	return h, nil
}
