package devenv

import (
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
)

// fakeCall makes one request to the fake model server and returns the
// status and the decoded JSON answer.
func fakeCall(t *testing.T, addr, method, path, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out map[string]any
	_ = json.Unmarshal(b, &out)
	return resp.StatusCode, out
}

// The fake model server listens on loopback only and answers as Ollama
// does: both models listed, a generate for a listed model answered
// non-streaming, an unknown model 404, a body without a model 400, and
// any other method or path refused.
func TestFakeModelAnswersAsOllama(t *testing.T) {
	fm, err := startFakeModel(clock.NewFake(time.Unix(1700000000, 0)), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer fm.close()
	if ap, err := net.ResolveTCPAddr("tcp", fm.addr); err != nil || !ap.IP.IsLoopback() {
		t.Fatalf("fake model server listens on %s, want loopback", fm.addr)
	}
	st, tags := fakeCall(t, fm.addr, "GET", "/api/tags", "")
	var names []string
	if ms, ok := tags["models"].([]any); ok {
		for _, m := range ms {
			names = append(names, m.(map[string]any)["name"].(string))
		}
	}
	if st != http.StatusOK || !slices.Equal(names, []string{FakeModelPublic, FakeModelPrivate}) {
		t.Fatalf("/api/tags: %d %v", st, tags)
	}
	if st, v := fakeCall(t, fm.addr, "GET", "/api/version", ""); st != http.StatusOK || v["version"] == "" {
		t.Fatalf("/api/version: %d %v", st, v)
	}
	st, gen := fakeCall(t, fm.addr, "POST", "/api/generate", `{"model":"tinyllama:latest","prompt":"hi","stream":false}`)
	if st != http.StatusOK || gen["model"] != FakeModelPublic || gen["response"] != FakeModelAnswer || gen["done"] != true {
		t.Fatalf("generate: %d %v", st, gen)
	}
	for _, c := range []struct {
		method, path, body string
		want               int
	}{
		{"POST", "/api/generate", `{"model":"llama3:70b"}`, http.StatusNotFound},
		{"POST", "/api/generate", `{"prompt":"no model"}`, http.StatusBadRequest},
		{"POST", "/api/generate", `not json`, http.StatusBadRequest},
		{"POST", "/api/generate", `{"model":"` + strings.Repeat("x", fakeModelMaxBody) + `"}`, http.StatusBadRequest},
		{"GET", "/api/generate", "", http.StatusMethodNotAllowed},
		{"POST", "/api/pull", `{"model":"tinyllama:latest"}`, http.StatusNotFound},
	} {
		if st, _ := fakeCall(t, fm.addr, c.method, c.path, c.body); st != c.want {
			t.Errorf("%s %s %.40q: %d, want %d", c.method, c.path, c.body, st, c.want)
		}
	}
}

// FuzzFakeGenerate: whatever the body, the fake server answers 200 only
// for a listed model (naming it, with FakeModelAnswer), else 400 or 404,
// and always JSON.
func FuzzFakeGenerate(f *testing.F) {
	clk := clock.NewFake(time.Unix(1700000000, 0))
	f.Fuzz(func(t *testing.T, body []byte) {
		st, v := fakeGenerate(clk, strings.NewReader(string(body)))
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("answer does not encode: %v", err)
		}
		var out map[string]any
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatal(err)
		}
		switch st {
		case http.StatusOK:
			m, _ := out["model"].(string)
			if !slices.Contains(fakeModels[:], m) || out["response"] != FakeModelAnswer {
				t.Fatalf("200 for %q: %s", body, b)
			}
		case http.StatusBadRequest, http.StatusNotFound:
			if _, ok := out["error"].(string); !ok {
				t.Fatalf("%d without an error: %s", st, b)
			}
		default:
			t.Fatalf("status %d for %q", st, body)
		}
	})
}
