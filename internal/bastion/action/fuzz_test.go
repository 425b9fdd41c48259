package action

import (
	"encoding/json"
	"net/netip"
	"net/url"
	"path"
	"strings"
	"testing"
	"unicode"

	"github.com/bettercompute/bettercompute/internal/netguard"
)

// FuzzCheck decodes a Program from JSON, as the op's args arrive, and
// checks that whatever Check lets through keeps every rule, judged here
// apart from Check's own code: script size, effect count and shape (no
// absolute path, no "..", no ".agent", no control character, clean, no
// duplicate), input count, http(s) URLs with a host, and a host written
// as an address public (unanchored) or at least not loopback, link-local
// or unspecified (anchored), never a localhost name.
func FuzzCheck(f *testing.F) {
	f.Add([]byte(`{"script":"true","effects":["a.txt"],"inputs":[{"url":"https://example.com/x","as":"x"}]}`), false)
	f.Add([]byte(`{"script":"echo","effects":["d/a"],"inputs":[{"url":"http://[64:ff9b::a00:1]/","as":"x"}]}`), true)
	f.Fuzz(func(t *testing.T, raw []byte, anchored bool) {
		var p Program
		if json.Unmarshal(raw, &p) != nil {
			return
		}
		e := newFuzzRunner(t, anchored)
		if e.Check(p) != nil {
			return
		}
		if p.Script == "" || len(p.Script) > MaxScriptBytes {
			t.Fatalf("script of %d bytes allowed", len(p.Script))
		}
		checkFuzzEffects(t, p.Effects)
		if len(p.Inputs) > MaxInputs {
			t.Fatalf("%d inputs allowed", len(p.Inputs))
		}
		for _, in := range p.Inputs {
			checkFuzzInput(t, in, anchored)
		}
	})
}

// newFuzzRunner is a Runner with no this-machine addresses and no DNS.
func newFuzzRunner(t *testing.T, anchored bool) *Runner {
	r, err := newRunner(Config{StateDir: t.TempDir(), Local: fakeLocal{}, Resolver: newFakeResolver(),
		Anchored: func() bool { return anchored }}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func checkFuzzEffects(t *testing.T, effects []string) {
	if len(effects) < 1 || len(effects) > MaxEffects {
		t.Fatalf("%d effects allowed", len(effects))
	}
	seen := map[string]bool{}
	for _, e := range effects {
		if seen[e] || strings.HasPrefix(e, "/") || path.Clean(e) != e || strings.ContainsFunc(e, unicode.IsControl) {
			t.Fatalf("effect %q allowed", e)
		}
		seen[e] = true
		for _, part := range strings.Split(e, "/") {
			if part == ".." || part == ".agent" || part == "." || part == "" {
				t.Fatalf("effect %q allowed", e)
			}
		}
	}
}

func checkFuzzInput(t *testing.T, in Input, anchored bool) {
	u, err := url.Parse(in.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || u.User != nil {
		t.Fatalf("input URL %q allowed", in.URL)
	}
	if strings.ContainsRune(in.As, '/') || in.As == "" || in.As == "." || in.As == ".." {
		t.Fatalf("input name %q allowed", in.As)
	}
	host := strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		t.Fatalf("localhost %q allowed", in.URL)
	}
	a, err := netip.ParseAddr(u.Hostname())
	if err != nil {
		return
	}
	r := netguard.Classify(a)
	for _, x := range netguard.Embedded4(a) {
		if rx := netguard.Classify(x); rx.Refused() && !r.Refused() {
			r = rx
		}
	}
	switch {
	case !anchored && r.Refused():
		t.Fatalf("address %s (%s) allowed", a, r)
	case anchored && (r == netguard.ReasonLoopback || r == netguard.ReasonLinkLocal || r == netguard.ReasonUnspecified):
		t.Fatalf("anchored: address %s (%s) allowed", a, r)
	}
}
