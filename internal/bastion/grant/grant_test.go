package grant

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/note"
)

const bastionID = "nod_abc123"

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

// keys makes a grant key pair, failing the test on error.
func keys(t testing.TB) (skey, vkey string) {
	t.Helper()
	skey, vkey, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return skey, vkey
}

// validDoc is a grant for bastionID valid around t0.
func validDoc() Doc {
	return Doc{
		V: 1, ID: "grt_one", Bastion: bastionID,
		Allow:    []string{FamilyInference, FamilyServices},
		Deny:     []string{FamilyEgress},
		Models:   []string{"llama3:8b", "mistral"},
		Reach:    []string{"db", "cache-1"},
		IssuedAt: t0.Add(-time.Hour).UnixMilli(), ExpiresAt: t0.Add(time.Hour).UnixMilli(),
	}
}

// signText signs arbitrary note text with skey, so tests can make
// validly signed bodies that Sign itself would refuse.
func signText(t testing.TB, skey, text string) []byte {
	t.Helper()
	s, err := note.NewSigner(skey)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := note.Sign(&note.Note{Text: text}, s)
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

func mustSign(t testing.TB, skey string, d Doc) []byte {
	t.Helper()
	msg, err := Sign(skey, d)
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

func TestSignVerifyRoundTrip(t *testing.T) {
	skey, vkey := keys(t)
	d := validDoc()
	msg := mustSign(t, skey, d)
	if strings.Count(strings.SplitN(string(msg), "\n\n", 2)[0], "\n") != 0 {
		t.Fatalf("body is not one line:\n%s", msg)
	}
	got, r := Verify(msg, vkey, bastionID, t0)
	if r != "" {
		t.Fatalf("Verify: %q", r)
	}
	if fmt.Sprint(got) != fmt.Sprint(d) {
		t.Fatalf("Verify = %+v, want %+v", got, d)
	}
	if strings.Contains(string(msg), "PRIVATE") {
		t.Fatal("the signed grant carries the private key")
	}
}

func TestVerifyReasons(t *testing.T) {
	skey, vkey := keys(t)
	otherSkey, otherVkey := keys(t)
	wrongNameSkey, wrongNameVkey, err := note.GenerateKey(rand.Reader, "not-bc-grant")
	if err != nil {
		t.Fatal(err)
	}
	good := mustSign(t, skey, validDoc())
	body := strings.SplitN(string(good), "\n", 2)[0]
	withBody := func(f func(string) string) []byte { return signText(t, skey, f(body)+"\n") }
	mutate := func(f func(*Doc)) []byte {
		d := validDoc()
		f(&d)
		return signText(t, skey, mustJSON(t, d)+"\n")
	}
	tampered := bytes.Replace(good, []byte(`"db"`), []byte(`"dc"`), 1)
	both := signText(t, otherSkey, body+"\n")
	both = append(both[:len(both)-1:len(both)-1], good[bytes.Index(good, []byte("\n\n"))+1:]...)
	cases := []struct {
		name  string
		msg   []byte
		vkey  string
		now   time.Time
		want  Reason
		bastn string
	}{
		{name: "valid", msg: good, want: ""},
		{name: "valid, also signed by another key", msg: both, want: ""},
		{name: "too large", msg: signText(t, skey, strings.Repeat("a", MaxGrantBytes)+"\n"), want: ReasonTooLarge},
		{name: "signed by another key only", msg: mustSign(t, otherSkey, validDoc()), want: ReasonSignature},
		{name: "pinned key of another name", msg: signText(t, wrongNameSkey, body+"\n"), vkey: wrongNameVkey, want: ReasonSignature},
		{name: "malformed pinned key", msg: good, vkey: "bc-grant+zzzz+AAAA", want: ReasonSignature},
		{name: "empty pinned key", msg: good, vkey: "-", want: ReasonSignature},
		{name: "body changed after signing", msg: tampered, want: ReasonSignature},
		{name: "not a note", msg: []byte(body + "\n"), want: ReasonMalformed},
		{name: "empty", msg: nil, want: ReasonMalformed},
		{name: "not JSON", msg: withBody(func(string) string { return "allow everything" }), want: ReasonMalformed},
		{name: "JSON array", msg: withBody(func(string) string { return "[1]" }), want: ReasonMalformed},
		{name: "unknown field", msg: withBody(func(b string) string { return strings.Replace(b, `{`, `{"root":true,`, 1) }), want: ReasonMalformed},
		{name: "field name in other case", msg: withBody(func(b string) string { return strings.Replace(b, `"allow"`, `"Allow"`, 1) }), want: ReasonMalformed},
		{name: "duplicate key", msg: withBody(func(b string) string { return strings.Replace(b, `{`, `{"allow":["egress"],`, 1) }), want: ReasonMalformed},
		{name: "trailing data", msg: withBody(func(b string) string { return b + ` {}` }), want: ReasonMalformed},
		{name: "two lines", msg: withBody(func(b string) string { return b + "\n" }), want: ReasonMalformed},
		{name: "wrong type", msg: withBody(func(b string) string { return strings.Replace(b, `"v":1`, `"v":"1"`, 1) }), want: ReasonMalformed},
		{name: "version 2", msg: mutate(func(d *Doc) { d.V = 2 }), want: ReasonMalformed},
		{name: "bad id", msg: mutate(func(d *Doc) { d.ID = "GRT one" }), want: ReasonMalformed},
		{name: "empty id", msg: mutate(func(d *Doc) { d.ID = "" }), want: ReasonMalformed},
		{name: "bad bastion", msg: mutate(func(d *Doc) { d.Bastion = "../x" }), want: ReasonMalformed},
		{name: "expiry before issue", msg: mutate(func(d *Doc) { d.ExpiresAt = d.IssuedAt }), want: ReasonMalformed},
		{name: "model with space", msg: mutate(func(d *Doc) { d.Models = []string{"llama 3"} }), want: ReasonMalformed},
		{name: "model too long", msg: mutate(func(d *Doc) { d.Models = []string{strings.Repeat("m", 129)} }), want: ReasonMalformed},
		{name: "too many models", msg: mutate(func(d *Doc) { d.Models = numbered("m", MaxModels+1) }), want: ReasonMalformed},
		{name: "duplicate model", msg: mutate(func(d *Doc) { d.Models = []string{"a:1", "a:1"} }), want: ReasonMalformed},
		{name: "bad reach", msg: mutate(func(d *Doc) { d.Reach = []string{"-db"} }), want: ReasonMalformed},
		{name: "too many reach", msg: mutate(func(d *Doc) { d.Reach = numbered("s", MaxReach+1) }), want: ReasonMalformed},
		{name: "duplicate allow", msg: mutate(func(d *Doc) { d.Allow = []string{FamilyModels, FamilyModels} }), want: ReasonMalformed},
		{name: "unknown allowed family", msg: mutate(func(d *Doc) { d.Allow = []string{"root"} }), want: ReasonUnknownFamily},
		{name: "unknown denied family", msg: mutate(func(d *Doc) { d.Deny = []string{"Inference"} }), want: ReasonUnknownFamily},
		{name: "other bastion", msg: mutate(func(d *Doc) { d.Bastion = "nod_other" }), want: ReasonOtherBastion},
		{name: "no bastion given", msg: good, bastn: "-", want: ReasonOtherBastion},
		{name: "at expiry", msg: good, now: t0.Add(time.Hour), want: ReasonExpired},
		{name: "just before expiry", msg: good, now: t0.Add(time.Hour - time.Millisecond), want: ""},
		{name: "issued 6 minutes ahead", msg: good, now: t0.Add(-time.Hour - 6*time.Minute), want: ReasonExpired},
		{name: "issued 4 minutes ahead", msg: good, now: t0.Add(-time.Hour - 4*time.Minute), want: ""},
	}
	_ = otherVkey
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			vk, now, b := vkey, t0, bastionID
			if c.vkey == "-" {
				vk = ""
			} else if c.vkey != "" {
				vk = c.vkey
			}
			if !c.now.IsZero() {
				now = c.now
			}
			if c.bastn == "-" {
				b = ""
			}
			d, r := Verify(c.msg, vk, b, now)
			if r != c.want {
				t.Fatalf("Verify reason = %q, want %q", r, c.want)
			}
			if r != "" && fmt.Sprint(d) != fmt.Sprint(Doc{}) {
				t.Fatalf("a refused grant returned a Doc: %+v", d)
			}
		})
	}
}

func TestSignRefusesWhatVerifyRefuses(t *testing.T) {
	skey, _ := keys(t)
	cases := []struct {
		name string
		f    func(*Doc)
		want Reason
	}{
		{"unknown family", func(d *Doc) { d.Allow = append(d.Allow, "shell") }, ReasonUnknownFamily},
		{"bad model", func(d *Doc) { d.Models = []string{"a\nb"} }, ReasonMalformed},
		{"no id", func(d *Doc) { d.ID = "" }, ReasonMalformed},
	}
	for _, c := range cases {
		d := validDoc()
		c.f(&d)
		_, err := Sign(skey, d)
		var re *RefusedError
		if !errors.As(err, &re) || re.Reason != c.want {
			t.Errorf("%s: Sign err = %v, want reason %q", c.name, err, c.want)
		}
	}
	if _, err := Sign("PRIVATE+KEY+bc-grant+00000000+AAAA", validDoc()); err == nil || strings.Contains(err.Error(), "AAAA") {
		t.Errorf("Sign with a malformed key: err = %v, want an error without the key", err)
	}
}

func numbered(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d", prefix, i)
	}
	return out
}
