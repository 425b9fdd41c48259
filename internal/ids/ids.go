// Package ids makes random identifiers and secrets.
package ids

import (
	"crypto/rand"
	"encoding/base32"
	"encoding/base64"
	"strings"
)

var lowerB32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// New returns prefix + 16 random lowercase base32 characters (80 bits), an
// identifier safe in URLs, SPIFFE paths and file names.
func New(prefix string) string {
	var b [10]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("ids: crypto/rand failed: " + err.Error())
	}
	return prefix + lowerB32.EncodeToString(b[:])
}

// Secret returns n random bytes encoded as unpadded base64url.
func Secret(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic("ids: crypto/rand failed: " + err.Error())
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// Valid reports whether s looks like an identifier New made with prefix.
func Valid(prefix, s string) bool {
	if !strings.HasPrefix(s, prefix) || len(s) != len(prefix)+16 {
		return false
	}
	for _, c := range s[len(prefix):] {
		if !(c >= 'a' && c <= 'z' || c >= '2' && c <= '7') {
			return false
		}
	}
	return true
}

// NameRule says in words what ValidName accepts.
const NameRule = "name must be 1 to 63 characters of letters, digits, '.', '_' or '-', starting with a letter or digit"

// ValidName reports whether a name an operator or a node chose is
// acceptable: a DNS-label-like ASCII name, so that no name can carry a
// terminal control, a look-alike character or a path.
func ValidName(name string) bool {
	if name == "" || len(name) > 63 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '.' && c != '_' && c != '-') {
			return false
		}
	}
	return true
}
