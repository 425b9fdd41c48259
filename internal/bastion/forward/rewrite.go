package forward

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// MaxListBytes caps a model list response: it is read whole to rewrite.
const MaxListBytes = 8 << 20

// ErrNotAList is RewriteModelList's error for a path that is not a model
// list of the kind.
var ErrNotAList = errors.New("forward: not a model list path")

// listShape is the JSON shape of a model list.
type listShape int

const (
	shapeNone   listShape = iota
	shapeOllama           // {"models":[{"name":..,"model":..},..]}
	shapeOpenAI           // {"object":"list","data":[{"id":..},..]}
)

// listShapeOf returns the shape of path's response for kind k.
func listShapeOf(k Kind, path string) listShape {
	if c, ok := classify(k, path); !ok || c != classList {
		return shapeNone
	}
	if path == "/v1/models" {
		return shapeOpenAI
	}
	return shapeOllama
}

// ollamaList and openAIList are the lists as rewritten: only the list,
// so no other top-level field of the upstream's answer passes.
type ollamaList struct {
	Models []map[string]json.RawMessage `json:"models"`
}

type openAIList struct {
	Object string                       `json:"object"`
	Data   []map[string]json.RawMessage `json:"data"`
}

// RewriteModelList rewrites a model list response body (/api/tags,
// /api/ps, /v1/models) to the entries in pol's scope. An entry is kept
// only when every field that names it ("name" and "model", or "id", in
// any case as encoding/json matches them) is a string in scope; fields
// that name another model (details.parent_model, "parent", "root") are
// dropped. The answer holds the list alone. A body that is not the
// expected JSON is an error; so is a path that is not a list (ErrNotAList).
func RewriteModelList(k Kind, path string, body []byte, pol Policy) ([]byte, error) {
	if len(body) > MaxListBytes {
		return nil, fmt.Errorf("forward: model list over %d bytes", MaxListBytes)
	}
	switch listShapeOf(k, path) {
	case shapeOllama:
		var in ollamaList
		if err := json.Unmarshal(body, &in); err != nil {
			return nil, fmt.Errorf("forward: model list: %w", err)
		}
		out := ollamaList{Models: keepInScope(in.Models, []string{"name", "model"}, pol)}
		return marshalList(out)
	case shapeOpenAI:
		var in openAIList
		if err := json.Unmarshal(body, &in); err != nil {
			return nil, fmt.Errorf("forward: model list: %w", err)
		}
		out := openAIList{Object: "list", Data: keepInScope(in.Data, []string{"id"}, pol)}
		return marshalList(out)
	}
	return nil, ErrNotAList
}

func marshalList(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("forward: model list: %w", err)
	}
	return b, nil
}

// keepInScope returns the entries whose name fields are all strings in
// scope (at least one present), with other-model fields dropped. It never
// returns nil, so an empty list stays a JSON array.
func keepInScope(entries []map[string]json.RawMessage, nameKeys []string, pol Policy) []map[string]json.RawMessage {
	out := make([]map[string]json.RawMessage, 0, len(entries))
	for _, e := range entries {
		if e == nil || !entryInScope(e, nameKeys, pol) {
			continue
		}
		out = append(out, scrubEntry(e))
	}
	return out
}

// entryInScope reports whether every field of e that names it is a
// string in scope, and at least one does.
func entryInScope(e map[string]json.RawMessage, nameKeys []string, pol Policy) bool {
	named := false
	for k, v := range e {
		if !matchKey(k, nameKeys) {
			continue
		}
		var s string
		if len(v) == 0 || v[0] != '"' || json.Unmarshal(v, &s) != nil || !InScope(pol, s) {
			return false
		}
		named = true
	}
	return named
}

// scrubEntry drops the fields that name a model other than the entry's
// own: ollama's details.parent_model, an OpenAI server's parent and root.
func scrubEntry(e map[string]json.RawMessage) map[string]json.RawMessage {
	out := make(map[string]json.RawMessage, len(e))
	for k, v := range e {
		switch {
		case matchKey(k, []string{"parent", "root"}): // archtest:not-tenant (a model field)
			continue
		case strings.EqualFold(k, "details"):
			d, ok := scrubDetails(v)
			if !ok {
				continue
			}
			v = d
		}
		out[k] = v
	}
	return out
}

// scrubDetails drops parent_model from a details object; ok is false when
// details is not an object (it is then dropped whole).
func scrubDetails(v json.RawMessage) (json.RawMessage, bool) {
	var d map[string]json.RawMessage
	if err := json.Unmarshal(v, &d); err != nil || d == nil {
		return nil, false
	}
	for k := range d {
		if strings.EqualFold(k, "parent_model") {
			delete(d, k)
		}
	}
	b, err := json.Marshal(d)
	if err != nil {
		return nil, false
	}
	return b, true
}
