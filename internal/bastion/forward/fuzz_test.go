package forward

import (
	"encoding/json"
	"strings"
	"testing"
)

// fuzzKinds maps a fuzz byte to a kind (an unknown one included).
func fuzzKind(b uint8) Kind {
	return [...]Kind{KindOllama, KindLLM, KindPII, "other"}[b%4]
}

// fuzzPolicy maps a fuzz byte to a grant with or without "models".
func fuzzPolicy(b uint8) testPolicy {
	if b%2 == 0 {
		return inference("llama3", "qwen2:7b")
	}
	return inferenceAndModels("llama3", "qwen2:7b")
}

// upstreamFields are the fields a Go upstream (ollama) would read a model
// from on path, written here apart from the filter's own list.
func upstreamFields(k Kind, path string) []string {
	switch {
	case k == KindPII:
		return []string{"model"}
	case path == "/api/copy":
		return []string{"model", "name", "source", "destination"}
	case path == "/api/create":
		return []string{"model", "name", "from"}
	}
	return []string{"model", "name"}
}

// upstreamView is what a Go upstream decodes from a body: encoding/json
// matches keys case-insensitively and keeps the last duplicate.
type upstreamView struct {
	Model       json.RawMessage `json:"model"`
	Name        json.RawMessage `json:"name"`
	Source      json.RawMessage `json:"source"`
	Destination json.RawMessage `json:"destination"`
	From        json.RawMessage `json:"from"`
}

func (v upstreamView) field(name string) json.RawMessage {
	return map[string]json.RawMessage{"model": v.Model, "name": v.Name, "source": v.Source,
		"destination": v.Destination, "from": v.From}[name]
}

func FuzzFilterRequest(f *testing.F) {
	f.Fuzz(func(t *testing.T, kindB, polB uint8, method, path string, body []byte) {
		k, pol := fuzzKind(kindB), fuzzPolicy(polB)
		if FilterRequest(k, method, path, body, pol) != "" {
			return
		}
		class, ok := classify(k, path)
		if !ok {
			t.Fatalf("allowed a path %q the kind %q does not list", path, k)
		}
		if class == classStore && !pol.Allows(FamilyModels) {
			t.Fatalf("allowed store path %q without models", path)
		}
		if class == classInfo || class == classList {
			return
		}
		var v upstreamView
		if json.Unmarshal(body, &v) != nil {
			if class != classAny {
				t.Fatalf("allowed a model path %q with a body Go cannot decode: %q", path, body)
			}
			return
		}
		named := false
		for _, name := range upstreamFields(k, path) {
			var s string
			if raw := v.field(name); raw != nil && json.Unmarshal(raw, &s) == nil && s != "" {
				named = true
				if !InScope(pol, s) {
					t.Fatalf("allowed %s %q for out-of-scope model %q: body %q", k, path, s, body)
				}
			}
		}
		if !named && class != classAny {
			t.Fatalf("allowed %s %q naming no model: %q", k, path, body)
		}
	})
}

func FuzzRewriteModelList(f *testing.F) {
	f.Fuzz(func(t *testing.T, kindB uint8, path string, body []byte) {
		k, pol := fuzzKind(kindB), inference("llama3", "qwen2:7b")
		out, err := RewriteModelList(k, path, body, pol)
		if err != nil {
			return
		}
		var l struct {
			Models []map[string]json.RawMessage `json:"models"`
			Data   []map[string]json.RawMessage `json:"data"`
		}
		if err := json.Unmarshal(out, &l); err != nil {
			t.Fatalf("rewritten list is not JSON: %q", out)
		}
		for _, e := range append(l.Models, l.Data...) {
			checkEntry(t, e, pol, out)
		}
	})
}

// checkEntry fails unless every field naming a model is in scope.
func checkEntry(t *testing.T, e map[string]json.RawMessage, pol Policy, out []byte) {
	t.Helper()
	named := false
	for k, v := range e {
		switch {
		case matchKey(k, []string{"name", "model", "id"}):
			var s string
			if json.Unmarshal(v, &s) != nil || !InScope(pol, s) {
				t.Fatalf("entry field %s=%s out of scope in %q", k, v, out)
			}
			named = true
		case matchKey(k, []string{"parent", "root"}):
			t.Fatalf("entry keeps %s in %q", k, out)
		case strings.EqualFold(k, "details") && keepsParentModel(v):
			t.Fatalf("details keep parent_model in %q", out)
		}
	}
	if !named {
		t.Fatalf("unnamed entry kept in %q", out)
	}
}

// keepsParentModel reports whether a details object still holds a key a
// client would read as parent_model (Go's decoder matches keys without
// regard to case). A longer key that merely starts with the name, or a
// value that mentions it, names no parent model.
func keepsParentModel(v json.RawMessage) bool {
	var d map[string]json.RawMessage
	if json.Unmarshal(v, &d) != nil {
		return true
	}
	for k := range d {
		if strings.EqualFold(k, "parent_model") {
			return true
		}
	}
	return false
}
