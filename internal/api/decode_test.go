package api

import (
	"encoding/json"
	"testing"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
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
		`{"name":"\u00e9\u00e9\u00e9\u00e9\u00e9"}`, `{"name":null}`, `{}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var in fuzzIn
		if err := Decode(raw, &in); err != nil {
			return
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
