package forward

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// MaxBodyBytes caps a request body: the filter reads it whole.
const MaxBodyBytes = 8 << 20

// The capability families a forward asks its Policy about.
const (
	// FamilyInference lets a pairing use the forwards at all.
	FamilyInference = "inference"
	// FamilyModels lets a pairing use the model store paths.
	FamilyModels = "models"
)

// Policy is what the pairing's current grant allows. grant.Policy
// satisfies it. The forward reads it at every accept and every request,
// since grants change.
type Policy interface {
	// Allows reports whether the grant holds a capability family
	// ("inference", "models").
	Allows(family string) bool
	// ModelInScope reports whether the grant's model scope holds model.
	ModelInScope(model string) bool
	// Models returns the models in scope, sorted (for list rewriting).
	Models() []string
}

// pathClass is what a known path needs.
type pathClass int

const (
	classInfo  pathClass = iota + 1 // no model (version)
	classList                       // no model; the response is a model list
	classModel                      // a model in scope
	classStore                      // the "models" family and a model in scope
	classAny                        // pii: any path, a JSON "model" in scope
)

// classify returns the class of path for kind k; ok is false for a path
// the kind does not forward (fail closed: only a known list).
func classify(k Kind, path string) (pathClass, bool) {
	switch k {
	case KindOllama:
		switch path {
		case "/api/generate", "/api/chat", "/api/embed", "/api/embeddings", "/api/show":
			return classModel, true
		case "/api/pull", "/api/push", "/api/delete", "/api/create", "/api/copy":
			return classStore, true
		case "/api/tags", "/api/ps":
			return classList, true
		case "/api/version":
			return classInfo, true
		}
		return classifyOpenAI(path)
	case KindLLM:
		return classifyOpenAI(path)
	case KindPII:
		return classAny, strings.HasPrefix(path, "/")
	}
	return 0, false
}

// classifyOpenAI classifies the OpenAI-compatible paths.
func classifyOpenAI(path string) (pathClass, bool) {
	switch path {
	case "/v1/models":
		return classList, true
	case "/v1/chat/completions", "/v1/completions", "/v1/embeddings":
		return classModel, true
	}
	return 0, false
}

// methodAllowed keeps tunnelling and tracing methods off every forward.
func methodAllowed(method string) bool {
	switch method {
	case "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS":
		return true
	}
	return false
}

// modelKeys are the top-level body fields that name a model on path.
// /api/create's "from" is its base model; /api/copy names two.
func modelKeys(k Kind, path string) []string {
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

// uncheckable returns the /api/create fields whose base model the filter
// cannot read: a Modelfile or path (older ollama), and blob digests in
// files or adapters, which could name an out-of-scope model's weights
// under an in-scope name. A request carrying one is refused.
func uncheckable() []string { return []string{"modelfile", "path", "files", "adapters"} }

// FilterRequest is the pure request filter: "" allows the request, else
// the reason it is refused. body is the whole request body; path is the
// decoded URL path, compared exactly (no cleaning: "/api/../api/pull" is
// not on any list).
func FilterRequest(k Kind, method, path string, body []byte, pol Policy) Reason {
	r, _ := filter(k, method, path, body, pol)
	return r
}

// filter is FilterRequest with a detail for the audit event.
func filter(k Kind, method, path string, body []byte, pol Policy) (Reason, string) {
	if pol == nil || !pol.Allows(FamilyInference) {
		return ReasonInferenceNotGranted, ""
	}
	if len(body) > MaxBodyBytes {
		return ReasonBodyTooLarge, ""
	}
	class, ok := classify(k, path)
	if !ok || !methodAllowed(method) {
		return ReasonPathNotAllowed, ""
	}
	switch class {
	case classInfo, classList:
		return "", ""
	case classAny:
		return filterAny(k, path, body, pol)
	case classStore:
		if !pol.Allows(FamilyModels) {
			return ReasonModelsNotGranted, ""
		}
	}
	return checkModels(k, path, body, pol, true)
}

// filterAny is the pii filter: a body that is a JSON object has its
// top-level "model" checked; plain UTF-8 text passes unchecked. A body a
// JSON parser might still read as an object in another encoding (a byte
// order mark, NUL bytes as in UTF-16 or UTF-32, invalid UTF-8) is refused,
// since it could carry a model the filter did not see.
func filterAny(k Kind, path string, body []byte, pol Policy) (Reason, string) {
	if !utf8.Valid(body) || bytes.IndexByte(body, 0) >= 0 || bytes.HasPrefix(body, []byte("\xef\xbb\xbf")) {
		return ReasonMalformedBody, "not plain UTF-8"
	}
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return "", "" // not JSON: no model field to check
	}
	return checkModels(k, path, body, pol, false)
}

// checkModels requires body to be one JSON object whose model fields are
// strings in scope; with required, at least one must name a model.
func checkModels(k Kind, path string, body []byte, pol Policy, required bool) (Reason, string) {
	keys := modelKeys(k, path)
	if path == "/api/create" {
		keys = append(keys, uncheckable()...)
	}
	fields, err := topLevelStrings(body, keys)
	if err != nil {
		return ReasonMalformedBody, ""
	}
	named := false
	for _, f := range fields {
		if matchKey(f.key, uncheckable()) {
			return ReasonModelOutOfScope, "field " + f.key + " cannot be checked"
		}
		if f.value == "" {
			continue // names nothing; ollama reads the other field
		}
		named = true
		if !InScope(pol, f.value) {
			return ReasonModelOutOfScope, "model " + clip(f.value)
		}
	}
	if required && !named {
		return ReasonModelOutOfScope, "no model named"
	}
	return "", ""
}

// field is one top-level key whose name matches a model key, and its
// string value.
type field struct{ key, value string }

var errNotObject = errors.New("forward: body is not one JSON object")

// topLevelStrings decodes body as exactly one JSON object and returns
// every top-level field whose key matches one of keys as encoding/json
// matches a struct field (case-insensitively, with Unicode folding), so a
// duplicate or differently cased key is seen as the upstream would see
// it. A matching field whose value is not a string is an error.
func topLevelStrings(body []byte, keys []string) ([]field, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, errNotObject
	}
	var out []field
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("forward: body key: %w", err)
		}
		key, _ := t.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("forward: body value: %w", err)
		}
		if !matchKey(key, keys) {
			continue
		}
		var s string
		if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
			return nil, fmt.Errorf("forward: field %q is not a string", key)
		}
		out = append(out, field{key: key, value: s})
	}
	if t, err := dec.Token(); err != nil || t != json.Delim('}') {
		return nil, errNotObject
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errNotObject // trailing data after the object
	}
	return out, nil
}

// matchKey reports whether key names one of keys as encoding/json would.
func matchKey(key string, keys []string) bool {
	for _, k := range keys {
		if strings.EqualFold(key, k) {
			return true
		}
	}
	return false
}

// NormalizeModel returns model with a missing tag filled in as ":latest"
// ("llama3" and "llama3:latest" are one model). The tag is looked for in
// the last path segment, so a registry port is not taken for one.
func NormalizeModel(model string) string {
	last := model[strings.LastIndex(model, "/")+1:]
	if last == "" || strings.Contains(last, ":") {
		return model
	}
	return model + ":latest"
}

// InScope reports whether pol's scope holds model, comparing after a
// missing tag is normalised to ":latest" on either side: model as given,
// its normalised form, and (for an explicit ":latest") the bare name.
func InScope(pol Policy, model string) bool {
	if model == "" {
		return false
	}
	if pol.ModelInScope(model) || pol.ModelInScope(NormalizeModel(model)) {
		return true
	}
	bare, ok := strings.CutSuffix(model, ":latest")
	return ok && bare != "" && NormalizeModel(bare) == model && pol.ModelInScope(bare)
}

// clip bounds a client-chosen string put in an audit detail.
func clip(s string) string {
	const max = 128
	if len(s) > max {
		s = s[:max] + "..."
	}
	return fmt.Sprintf("%q", s)
}
