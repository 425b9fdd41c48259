package commands

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

// TestSecretRefs: references are found in every string of a payload,
// keys, escaped forms and several to a string included, once each.
func TestSecretRefs(t *testing.T) {
	for payload, want := range map[string][]string{
		`{}`:                     nil,
		`{"ref":"secret://a/x"}`: {"secret://a/x"},
		`{"argv":["run","--t=secret://b/y;echo"]}`:     {"secret://b/y"},
		`{"secret://c/z":1}`:                           {"secret://c/z"},
		`{"x":"secret:\/\/d\u002fw"}`:                  {"secret://d/w"},
		`["SECRET://e/v secret://a/x","secret://a/x"]`: {"SECRET://e/v", "secret://a/x"},
		`{"k":"secret://a/x","k":"y"}`:                 {"secret://a/x"},
		`{"x":"secret://"}`:                            {"secret://"},
		// Letters whose lower case has another length (U+023A grows, the
		// Kelvin sign shrinks) shift nothing.
		`{"x":"ȺȺȺȺȺȺȺȺȺȺsecret://"}`:       {"secret://"},
		`{"x":"ȺȺȺsecret://ro/t/x"}`:        {"secret://ro/t/x"},
		`{"x":"KKKKxxSeCrEt://root/fleet"}`: {"SeCrEt://root/fleet"},
	} {
		got, err := SecretRefs([]byte(payload))
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%s: %q %v, want %q", payload, got, err, want)
		}
	}
}

// FuzzSecretRefs: any valid JSON is walked without panicking (duplicate
// keys included: every value is walked, not only the last), and every
// reference found is the scheme followed by reference characters only.
func FuzzSecretRefs(f *testing.F) {
	f.Add([]byte(`{"ref":"secret://a/x","argv":["secret://b/y"]}`))
	f.Add([]byte(`["secret:\/\/c/z", {"secret://d/w": null}]`))
	f.Add([]byte(`{"x":"ȺȺȺȺȺȺȺȺȺȺsecret://","y":"KKSECRET://a/b"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		if !json.Valid(data) {
			return
		}
		refs, err := SecretRefs(data)
		if err != nil {
			t.Fatalf("valid JSON refused: %v", err)
		}
		for _, r := range refs {
			if !strings.EqualFold(r[:min(len(r), len(secretScheme))], secretScheme) {
				t.Fatalf("ref %q does not start with the scheme", r)
			}
			for i := len(secretScheme); i < len(r); i++ {
				if !refChar(r[i]) {
					t.Fatalf("ref %q holds %q", r, r[i])
				}
			}
		}
	})
}
