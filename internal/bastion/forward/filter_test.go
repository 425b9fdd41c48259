package forward

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestFilterRequest(t *testing.T) {
	pol := inferenceAndModels("llama3", "qwen2:7b", "org/model")
	noStore := inference("llama3", "qwen2:7b")
	for _, tc := range []struct {
		name         string
		kind         Kind
		method, path string
		body         string
		pol          Policy
		want         Reason
	}{
		{"no policy", KindOllama, "GET", "/api/tags", "", nil, ReasonInferenceNotGranted},
		{"no inference", KindOllama, "GET", "/api/tags", "", testPolicy{families: []string{FamilyModels}}, ReasonInferenceNotGranted},
		{"tags", KindOllama, "GET", "/api/tags", "", noStore, ""},
		{"version", KindOllama, "GET", "/api/version", "", noStore, ""},
		{"unknown path", KindOllama, "GET", "/api/blobs/x", "", pol, ReasonPathNotAllowed},
		{"unclean path", KindOllama, "POST", "/api/./generate", `{"model":"llama3"}`, pol, ReasonPathNotAllowed},
		{"trailing slash", KindOllama, "POST", "/api/generate/", `{"model":"llama3"}`, pol, ReasonPathNotAllowed},
		{"connect", KindOllama, "CONNECT", "/api/tags", "", pol, ReasonPathNotAllowed},
		{"generate in scope", KindOllama, "POST", "/api/generate", `{"model":"llama3"}`, noStore, ""},
		{"tag normalised", KindOllama, "POST", "/api/chat", `{"model":"llama3:latest"}`, noStore, ""},
		{"bare normalised", KindOllama, "POST", "/api/chat", `{"model":"llama3"}`, inference("llama3:latest"), ""},
		{"other tag", KindOllama, "POST", "/api/chat", `{"model":"llama3:8b"}`, noStore, ReasonModelOutOfScope},
		{"out of scope", KindOllama, "POST", "/api/generate", `{"model":"secret"}`, pol, ReasonModelOutOfScope},
		{"name field", KindOllama, "POST", "/api/show", `{"name":"secret"}`, pol, ReasonModelOutOfScope},
		{"folded key", KindOllama, "POST", "/api/show", `{"model":"llama3","Name":"secret"}`, pol, ReasonModelOutOfScope},
		{"duplicate key", KindOllama, "POST", "/api/generate", `{"model":"llama3","model":"secret"}`, pol, ReasonModelOutOfScope},
		{"escaped key", KindOllama, "POST", "/api/generate", `{"model":"llama3","mod\u0065l":"secret"}`, pol, ReasonModelOutOfScope},
		{"no model", KindOllama, "POST", "/api/embed", `{"input":"x"}`, pol, ReasonModelOutOfScope},
		{"empty model", KindOllama, "POST", "/api/embed", `{"model":""}`, pol, ReasonModelOutOfScope},
		{"empty body", KindOllama, "POST", "/api/generate", ``, pol, ReasonMalformedBody},
		{"array body", KindOllama, "POST", "/api/generate", `[{"model":"llama3"}]`, pol, ReasonMalformedBody},
		{"two objects", KindOllama, "POST", "/api/generate", `{"model":"llama3"}{"model":"secret"}`, pol, ReasonMalformedBody},
		{"model not string", KindOllama, "POST", "/api/generate", `{"model":["secret"]}`, pol, ReasonMalformedBody},
		{"model null", KindOllama, "POST", "/api/generate", `{"model":null}`, pol, ReasonMalformedBody},
		{"pull without models", KindOllama, "POST", "/api/pull", `{"model":"llama3"}`, noStore, ReasonModelsNotGranted},
		{"delete without models", KindOllama, "DELETE", "/api/delete", `{"model":"llama3"}`, noStore, ReasonModelsNotGranted},
		{"pull with models", KindOllama, "POST", "/api/pull", `{"model":"llama3"}`, pol, ""},
		{"pull out of scope", KindOllama, "POST", "/api/pull", `{"name":"secret"}`, pol, ReasonModelOutOfScope},
		{"copy in scope", KindOllama, "POST", "/api/copy", `{"source":"llama3","destination":"qwen2:7b"}`, pol, ""},
		{"copy from secret", KindOllama, "POST", "/api/copy", `{"source":"secret","destination":"llama3"}`, pol, ReasonModelOutOfScope},
		{"copy to secret", KindOllama, "POST", "/api/copy", `{"source":"llama3","destination":"secret"}`, pol, ReasonModelOutOfScope},
		{"copy folded key", KindOllama, "POST", "/api/copy", `{"source":"llama3","destination":"llama3","\u017fource":"secret"}`, pol, ReasonModelOutOfScope},
		{"create from secret", KindOllama, "POST", "/api/create", `{"model":"llama3","from":"secret"}`, pol, ReasonModelOutOfScope},
		{"create modelfile", KindOllama, "POST", "/api/create", `{"model":"llama3","modelfile":"FROM secret"}`, pol, ReasonModelOutOfScope},
		{"create in scope", KindOllama, "POST", "/api/create", `{"model":"llama3","from":"qwen2:7b"}`, pol, ""},
		{"ollama openai", KindOllama, "POST", "/v1/chat/completions", `{"model":"secret"}`, pol, ReasonModelOutOfScope},
		{"llm in scope", KindLLM, "POST", "/v1/completions", `{"model":"org/model"}`, pol, ""},
		{"llm native path", KindLLM, "POST", "/api/generate", `{"model":"llama3"}`, pol, ReasonPathNotAllowed},
		{"llm models list", KindLLM, "GET", "/v1/models", "", pol, ""},
		{"pii any path", KindPII, "POST", "/sterilize", `{"text":"x","name":"Alice"}`, noStore, ""},
		{"pii plain text", KindPII, "POST", "/x", `Alice lives at 1 Main St`, noStore, ""},
		{"pii model out of scope", KindPII, "POST", "/x", ` {"model":"secret"}`, noStore, ReasonModelOutOfScope},
		{"pii bad json", KindPII, "POST", "/x", `{"model":"llama3"`, noStore, ReasonMalformedBody},
		{"pii utf-16", KindPII, "POST", "/x", "\x00{\x00\"\x00m\x00", noStore, ReasonMalformedBody},
		{"pii bom", KindPII, "POST", "/x", "\xef\xbb\xbf{\"model\":\"secret\"}", noStore, ReasonMalformedBody},
		{"pii no slash", KindPII, "OPTIONS", "*", "", noStore, ReasonPathNotAllowed},
		{"unknown kind", Kind("x"), "GET", "/api/tags", "", pol, ReasonPathNotAllowed},
	} {
		if got := FilterRequest(tc.kind, tc.method, tc.path, []byte(tc.body), tc.pol); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
	big := []byte(`{"model":"llama3","x":"` + strings.Repeat("a", MaxBodyBytes) + `"}`)
	if got := FilterRequest(KindOllama, "POST", "/api/generate", big, pol); got != ReasonBodyTooLarge {
		t.Errorf("big body: %q", got)
	}
}

func TestRewriteModelList(t *testing.T) {
	pol := inference("llama3", "qwen2:7b")
	out, err := RewriteModelList(KindOllama, "/api/tags",
		[]byte(`{"models":[{"name":"llama3","model":"llama3:latest","details":{"parent_model":"secret","family":"llama"}},`+
			`{"name":"qwen2:7b","Model":"secret"},{"name":"secret"},{"size":1},{"name":5}],"extra":"secret"}`), pol)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"models":[{"details":{"family":"llama"},"model":"llama3:latest","name":"llama3"}]}`; string(out) != want {
		t.Fatalf("ollama list\n got %s\nwant %s", out, want)
	}
	out, err = RewriteModelList(KindLLM, "/v1/models",
		[]byte(`{"object":"list","data":[{"id":"qwen2:7b","root":"secret","parent":"secret"},{"id":"secret"},{"ID":"llama3","id":"secret"}]}`), pol)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"object":"list","data":[{"id":"qwen2:7b"}]}`; string(out) != want {
		t.Fatalf("openai list\n got %s\nwant %s", out, want)
	}
	out, err = RewriteModelList(KindOllama, "/api/ps", []byte(`{"models":null}`), pol)
	if err != nil || string(out) != `{"models":[]}` {
		t.Fatalf("empty list: %s %v", out, err)
	}
	if _, err := RewriteModelList(KindOllama, "/api/tags", []byte(`not json`), pol); err == nil {
		t.Fatal("malformed list rewritten")
	}
	if _, err := RewriteModelList(KindPII, "/v1/models", []byte(`{}`), pol); !errors.Is(err, ErrNotAList) {
		t.Fatalf("pii list: %v", err)
	}
	var v any
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatal(err)
	}
}

func TestNormalizeModel(t *testing.T) {
	for in, want := range map[string]string{
		"llama3":                "llama3:latest",
		"llama3:8b":             "llama3:8b",
		"host:5000/ns/model":    "host:5000/ns/model:latest",
		"host:5000/ns/model:v1": "host:5000/ns/model:v1",
		"org/":                  "org/",
		"":                      "",
	} {
		if got := NormalizeModel(in); got != want {
			t.Errorf("NormalizeModel(%q) = %q, want %q", in, got, want)
		}
	}
	if InScope(inference("llama3"), "llama3:latest:latest") || InScope(inference("x"), ":latest") {
		t.Error("InScope widened the scope")
	}
}
