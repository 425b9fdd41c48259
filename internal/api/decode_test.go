package api

import (
	"encoding/json"
	"testing"
	"unicode/utf8"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/errs"
)

// fuzzIn is an input type with every kind of bound Decode enforces.
type fuzzIn struct {
	apitypes.TenantIn
	Name   string            `json:"name" api:"max=8"`
	Count  int64             `json:"count" api:"min=-3,max=70"`
	Tags   []string          `json:"tags" api:"items=3,max=4"`
	Labels map[string]string `json:"labels" api:"items=2,keymax=3,max=5"`
	Inner  struct {
		Flag bool  `json:"flag"`
		N    uint8 `json:"n" api:"min=0,max=200"`
	} `json:"inner"`
	Raw json.RawMessage `json:"raw"`
}

// FuzzDecodeStrict: whatever Decode accepts names only exact fields (no
// case variant), and every value is within its field's bounds.
func FuzzDecodeStrict(f *testing.F) {
	for _, s := range []string{
		`{"name":"abc","count":3,"tags":["a"],"labels":{"k":"v"},"inner":{"flag":true,"n":7},"raw":[1,{"x":2}]}`,
		`{"NAME":"a"}`, `{"name":"a","Name":"b"}`, `{"Tenant_ID":"x"}`, `{"tenant_id":"root"}`,
		`{"count":71}`, `{"count":-4}`, `{"count":1.5}`, `{"count":18446744073709551616}`,
		`{"inner":{"N":1}}`, `{"inner":{"n":256}}`, `{"tags":["a","b","c","d"]}`, `{"labels":{"long":"v"}}`,
		`{"name":"\u00e9\u00e9\u00e9\u00e9\u00e9"}`, `{"name":null}`, `{}`, "{\"name\":\"\xff\"}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var in fuzzIn
		if err := Decode(raw, &in); err != nil {
			return
		}
		if !utf8.Valid(raw) {
			t.Fatalf("accepted %q, not UTF-8", raw)
		}
		var top map[string]json.RawMessage
		if err := json.Unmarshal(raw, &top); err != nil {
			t.Fatalf("accepted %q, not an object: %v", raw, err)
		}
		for k := range top {
			switch k {
			case "tenant_id", "name", "count", "tags", "labels", "inner", "raw":
			default:
				t.Fatalf("accepted key %q in %q", k, raw)
			}
		}
		if v, ok := top["inner"]; ok {
			var inner map[string]json.RawMessage
			if json.Unmarshal(v, &inner) == nil {
				for k := range inner {
					if k != "flag" && k != "n" {
						t.Fatalf("accepted inner key %q in %q", k, raw)
					}
				}
			}
		}
		if len(in.Name) > 8 || in.Count < -3 || in.Count > 70 || len(in.Tags) > 3 || len(in.Labels) > 2 || in.Inner.N > 200 || len(in.TenantID) > fallbackMaxString {
			t.Fatalf("accepted out of bounds: %q -> %+v", raw, in)
		}
		for _, s := range in.Tags {
			if len(s) > 4 {
				t.Fatalf("accepted tag %q", s)
			}
		}
		for k, v := range in.Labels {
			if len(k) > 3 || len(v) > 5 {
				t.Fatalf("accepted label %q=%q", k, v)
			}
		}
	})
}

// TestDecodeRefusesInvalidUTF8: a body with bytes that are not UTF-8 is
// INVALID_INPUT, in a value or a key, never stored as U+FFFD (which Go's
// decoder makes of them).
func TestDecodeRefusesInvalidUTF8(t *testing.T) {
	for _, raw := range []string{"{\"name\":\"\xff\"}", "{\"tenant_id\":\"\xff\xfe\"}", "{\"tags\":[\"a\xc3\"]}", "{\"\xffname\":\"a\"}", `{"name":"a\ud800b"}`} {
		var in fuzzIn
		err := Decode([]byte(raw), &in)
		if errs.CodeOf(err) != errs.InvalidInput || errs.SafeMessage(err) != "the body is not valid UTF-8" {
			t.Errorf("%q: %v, want INVALID_INPUT the body is not valid UTF-8", raw, err)
		}
	}
}

// TestDecodeRefusesBadBase64: a []byte field takes only what encoding/json
// decodes (standard, padded base64); anything else is INVALID_INPUT naming
// the field, never the internal error of a decode that checks disagreed
// with (the fuzz corpus keeps the input that found it:
// testdata/fuzz/FuzzMethodBodies/77ec776f7d748516).
func TestDecodeRefusesBadBase64(t *testing.T) {
	type in struct {
		Sig []byte `json:"sig" api:"max=64"`
	}
	var v in
	if err := Decode([]byte(`{"sig":"AQ=="}`), &v); err != nil || len(v.Sig) != 1 {
		t.Fatalf("valid base64: %v %v", v.Sig, err)
	}
	for _, body := range []string{`{"sig":"A\u00ebQ=="}`, `{"sig":"AQ"}`, `{"sig":"A-_="}`} {
		err := Decode([]byte(body), &v)
		if errs.CodeOf(err) != errs.InvalidInput || err.Error() != `INVALID_INPUT: field "sig": not base64 (standard alphabet, padded)` {
			t.Errorf("%q: %v, want INVALID_INPUT naming sig", body, err)
		}
	}
	// Bytes that are not UTF-8 are refused before any field is read.
	if err := Decode([]byte("{\"sig\":\"A\xeb\xebQ==\"}"), &v); errs.CodeOf(err) != errs.InvalidInput || err.Error() != "INVALID_INPUT: the body is not valid UTF-8" {
		t.Errorf("raw bytes in sig: %v, want INVALID_INPUT the body is not valid UTF-8", err)
	}
}
