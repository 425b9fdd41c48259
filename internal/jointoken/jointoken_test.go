package jointoken

import (
	"errors"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/ids"
)

func valid() Token {
	var t Token
	t.Pin[0] = 7
	t.ID = ids.New("jt_")
	t.Secret = ids.Secret(32)
	return t
}

func TestParse(t *testing.T) {
	tok := valid()
	got, err := Parse(" " + tok.String() + "\n")
	if err != nil || got != tok {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	s := tok.String()
	bad := map[string]string{
		"empty":          "",
		"prefix":         "bcj2" + s[4:],
		"short secret":   s[:len(s)-1],
		"extra part":     s + ".x",
		"bad pin":        strings.Replace(s, s[5:48], "!!!", 1),
		"bad id":         strings.Replace(s, tok.ID, "jt_UPPERCASEIDXXXX", 1),
		"secret not b64": s[:len(s)-1] + "*",
	}
	for name, in := range bad {
		if _, err := Parse(in); !errors.Is(err, ErrTokenMalformed) {
			t.Errorf("%s: got %v, want ErrTokenMalformed", name, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add(valid().String())
	f.Add("bcj1...")
	f.Add("bcj1.AAAA.jt_aaaaaaaaaaaaaaaa.x")
	f.Fuzz(func(t *testing.T, in string) {
		tok, err := Parse(in)
		if err != nil {
			return
		}
		again, err := Parse(tok.String())
		if err != nil || again != tok {
			t.Fatalf("accepted %q but its rendering %q does not parse back", in, tok.String())
		}
		if len(HashSecret(tok.Secret)) != 32 {
			t.Fatal("hash length")
		}
	})
}
