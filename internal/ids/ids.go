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
