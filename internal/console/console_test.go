package console_test

import (
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/console"
)

const (
	testOrigin  = "https://bc.example"
	testSession = "bcs_ss1_secret"
	testKey     = "bck_goodkey"
	scriptName  = "<script>alert(1)</script>"
)

// fakeAPI stands in for the api envelope: it holds every call to the
// envelope's rules for a session (cookie, exact Origin, X-Better-Compute,
// JSON) and records what it was asked.
type fakeAPI struct {
	mu      sync.Mutex
	calls   []*http.Request
	revoked bool
	// methods answer by name; unknown names answer NOT_FOUND.
	methods map[string]func(body map[string]any) (int, any)
}

func newFakeAPI() *fakeAPI {
	f := &fakeAPI{}
	f.methods = map[string]func(map[string]any) (int, any){
		"sessions.create": func(map[string]any) (int, any) {
			return 200, map[string]any{"cookie": "bc_session", "id": "ss1", "value": testSession, "expires_at": time.Now().Add(time.Hour)}
		},
		"sessions.revoke": func(map[string]any) (int, any) { f.revoked = true; return 200, map[string]any{} },
		"nodes.list": func(map[string]any) (int, any) {
			return 200, map[string]any{"nodes": []map[string]any{{"id": "n_1", "name": scriptName, "connected": true, "state": "active",
				"labels": map[string]string{"rack": "<img src=x onerror=alert(2)>"}}}}
		},
		"commands.list": func(map[string]any) (int, any) {
			return 200, map[string]any{"commands": []map[string]any{{"id": "c_1", "node_id": "n_1", "kind": "diag.run", "state": "succeeded"}}}
		},
		"commands.get": func(b map[string]any) (int, any) {
			if b["id"] != "c_1" {
				return 404, errBody("NOT_FOUND", "command not found")
			}
			return 200, map[string]any{"id": "c_1", "node_id": "n_1", "kind": "diag.run", "state": "succeeded", "attested": true, "result": map[string]any{"out": scriptName}}
		},
		"commands.attestation": func(map[string]any) (int, any) { return 200, map[string]any{"command_id": "c_1", "context": "ctx"} },
		"approvals.list": func(map[string]any) (int, any) {
			return 200, map[string]any{"approvals": []map[string]any{{"id": "ap_1", "state": "pending", "text": "create sandbox " + scriptName}}}
		},
		"batches.get": func(map[string]any) (int, any) {
			return 200, map[string]any{"id": "b_1", "deployment": "dep.example", "root": "ab12", "state": "proposed", "threshold": 2,
				"agent": "bot-1", "agent_for": "alice", "leaves": []map[string]any{{"index": 0, "node_id": "n_1", "kind": "disk.wipe"}}}
		},
		"approvals.approve": func(map[string]any) (int, any) { return 200, map[string]any{} },
		"approvals.deny":    func(map[string]any) (int, any) { return 200, map[string]any{} },
	}
	return f
}

func errBody(code, msg string) any {
	return map[string]any{"error": map[string]any{"code": code, "message": msg, "request_id": "req_1"}}
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, r)
	status, out := f.answer(r)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(out)
}

func (f *fakeAPI) answer(r *http.Request) (int, any) {
	if r.Method != http.MethodPost || r.Header.Get("X-Better-Compute") != "1" || r.Header.Get("Content-Type") != "application/json" {
		return 403, errBody("CSRF_REJECTED", "headers")
	}
	name := strings.TrimPrefix(r.URL.Path, "/api/v1/")
	if name == "sessions.create" {
		if r.Header.Get("Authorization") != "Bearer "+testKey {
			return 401, errBody("UNAUTHENTICATED", "bad key")
		}
	} else {
		ck, err := r.Cookie("bc_session")
		if err != nil || ck.Value != testSession || f.revoked {
			return 401, errBody("UNAUTHENTICATED", "no session")
		}
		if r.Header.Get("Origin") != testOrigin {
			return 403, errBody("UNTRUSTED_ORIGIN", "origin")
		}
	}
	var body map[string]any
	_ = json.NewDecoder(r.Body).Decode(&body)
	h, ok := f.methods[name]
	if !ok {
		return 404, errBody("NOT_FOUND", "unknown method")
	}
	return h(body)
}

// called returns how many calls of method the API received.
func (f *fakeAPI) called(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, r := range f.calls {
		if r.URL.Path == "/api/v1/"+method {
			n++
		}
	}
	return n
}

func newConsole(t *testing.T, api http.Handler, base string) http.Handler {
	t.Helper()
	c, err := console.New(console.Config{API: api, SessionCookies: true, BaseURL: base})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// do sends one request to h; signedIn adds the session cookie.
func do(h http.Handler, method, path, origin string, form url.Values, signedIn bool) *httptest.ResponseRecorder {
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	r := httptest.NewRequest(method, path, body)
	r.RemoteAddr = "192.0.2.7:4242"
	if form != nil {
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if origin != "" {
		r.Header.Set("Origin", origin)
	}
	if signedIn {
		r.AddCookie(&http.Cookie{Name: console.SessionCookie, Value: testSession})
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// A node's name and labels, a command's result and an approval's text are
// rendered as text: html/template escapes them, so a <script> name is
// never markup.
func TestConsoleEscapesCallerStrings(t *testing.T) {
	h := newConsole(t, newFakeAPI(), testOrigin)
	for _, path := range []string{"/console/fleet", "/console/commands/c_1", "/console/approvals"} {
		w := do(h, "GET", path, "", nil, true)
		body := w.Body.String()
		if w.Code != 200 {
			t.Fatalf("%s: %d %s", path, w.Code, body)
		}
		if strings.Contains(body, "<script") || strings.Contains(body, "<img") {
			t.Fatalf("%s renders caller markup unescaped:\n%s", path, body)
		}
		if !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
			t.Fatalf("%s does not show the escaped name:\n%s", path, body)
		}
	}
}

// Every console answer, signed in or out, a page, an error, a refusal or
// the stylesheet, carries the strict CSP and the other headers.
func TestConsoleSecurityHeaders(t *testing.T) {
	h := newConsole(t, newFakeAPI(), testOrigin)
	cases := []struct {
		method, path, origin string
		form                 url.Values
		signedIn             bool
	}{
		{"GET", "/console/signin", "", nil, false},
		{"GET", "/console/fleet", "", nil, false},
		{"GET", "/console/fleet", "", nil, true},
		{"GET", "/console/commands/nope", "", nil, true},
		{"GET", "/console/static/console.css", "", nil, false},
		{"GET", "/console/no/such/page", "", nil, true},
		{"POST", "/console/signout", "https://evil.example", url.Values{}, true},
	}
	for _, c := range cases {
		w := do(h, c.method, c.path, c.origin, c.form, c.signedIn)
		want := map[string]string{"Content-Security-Policy": console.CSP, "X-Content-Type-Options": "nosniff",
			"Referrer-Policy": "same-origin", "Cache-Control": "no-store", "X-Frame-Options": "DENY"}
		for k, v := range want {
			if got := w.Header().Get(k); got != v {
				t.Errorf("%s %s: %s = %q, want %q", c.method, c.path, k, got, v)
			}
		}
	}
	for _, bad := range []string{"unsafe-inline", "unsafe-eval", "script-src"} {
		if strings.Contains(console.CSP, bad) {
			t.Fatalf("CSP allows %s: %s", bad, console.CSP)
		}
	}
	for _, need := range []string{"default-src 'none'", "frame-ancestors 'none'", "form-action 'self'", "base-uri 'none'"} {
		if !strings.Contains(console.CSP, need) {
			t.Fatalf("CSP lacks %s: %s", need, console.CSP)
		}
	}
}

// The console pages carry no script: no <script> element, no inline event
// handler, no javascript: URL, no inline style.
func TestConsolePagesHaveNoScript(t *testing.T) {
	h := newConsole(t, newFakeAPI(), testOrigin)
	for _, path := range []string{"/console/signin", "/console/fleet", "/console/commands/c_1", "/console/approvals", "/console/commands/nope"} {
		body := strings.ToLower(do(h, "GET", path, "", nil, path != "/console/signin").Body.String())
		for _, bad := range []*regexp.Regexp{regexp.MustCompile(`<script`), regexp.MustCompile(`<[^>]*\son[a-z]+\s*=`),
			regexp.MustCompile(`<[^>]*javascript:`), regexp.MustCompile(`<[^>]*\sstyle\s*=`), regexp.MustCompile(`<style`)} {
			if bad.MatchString(body) {
				t.Fatalf("%s matches %s", path, bad)
			}
		}
	}
}

// A console mutation needs the exact Origin and the session's CSRF token:
// without either, or with a wrong one, it answers 403 with the refusal's
// code and the API is never called.
func TestConsoleMutationNeedsOriginAndCSRF(t *testing.T) {
	good := console.CSRFToken(testSession)
	cases := []struct {
		name, origin, csrf, code string
	}{
		{"no token", testOrigin, "", "CSRF_REJECTED"},
		{"wrong token", testOrigin, console.CSRFToken("bcs_other"), "CSRF_REJECTED"},
		{"no origin", "", good, "CSRF_REJECTED"},
		{"other origin", "https://evil.example", good, "UNTRUSTED_ORIGIN"},
		{"origin with another port", testOrigin + ":444", good, "UNTRUSTED_ORIGIN"},
		{"null origin", "null", good, "UNTRUSTED_ORIGIN"},
	}
	for _, c := range cases {
		for _, path := range []string{"/console/approvals/ap_1/approve", "/console/approvals/ap_1/deny", "/console/signout"} {
			api := newFakeAPI()
			h := newConsole(t, api, testOrigin)
			w := do(h, "POST", path, c.origin, url.Values{console.CSRFField: {c.csrf}}, true)
			if w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), c.code) {
				t.Fatalf("%s %s: %d, want 403 %s:\n%s", c.name, path, w.Code, c.code, w.Body.String())
			}
			if n := len(api.calls); n != 0 || api.revoked {
				t.Fatalf("%s %s: the API was called %d times (revoked %v)", c.name, path, n, api.revoked)
			}
			if w.Header().Get("Set-Cookie") != "" {
				t.Fatalf("%s %s: a refused sign-out touched the cookie", c.name, path)
			}
		}
	}
	api := newFakeAPI()
	h := newConsole(t, api, testOrigin)
	w := do(h, "POST", "/console/approvals/ap_1/approve", testOrigin, url.Values{console.CSRFField: {good}}, true)
	if w.Code != http.StatusSeeOther || api.called("approvals.approve") != 1 {
		t.Fatalf("a good approve: %d, %d calls", w.Code, api.called("approvals.approve"))
	}
}

// Sign-in with a wrong Origin is refused before the key is used.
func TestConsoleSignInNeedsOrigin(t *testing.T) {
	api := newFakeAPI()
	h := newConsole(t, api, testOrigin)
	w := do(h, "POST", "/console/signin", "https://evil.example", url.Values{"api_key": {testKey}}, false)
	if w.Code != http.StatusForbidden || len(api.calls) != 0 || w.Header().Get("Set-Cookie") != "" {
		t.Fatalf("sign-in from another origin: %d, %d calls, cookie %q", w.Code, len(api.calls), w.Header().Get("Set-Cookie"))
	}
	w = do(h, "POST", "/console/signin", testOrigin, url.Values{"api_key": {"bck_wrong"}}, false)
	if w.Code != http.StatusUnauthorized || w.Header().Get("Set-Cookie") != "" || strings.Contains(w.Body.String(), "bck_wrong") {
		t.Fatalf("sign-in with a wrong key: %d, cookie %q", w.Code, w.Header().Get("Set-Cookie"))
	}
}

// The session cookie is the API's bc_session: HttpOnly, SameSite=Strict,
// Path=/, Secure when the base URL is https or the request came over TLS,
// and sign-out revokes the session and clears it.
func TestConsoleSessionCookie(t *testing.T) {
	for _, c := range []struct {
		base   string
		tls    bool
		secure bool
	}{{testOrigin, false, true}, {"http://127.0.0.1:7780", false, false}, {"http://127.0.0.1:7780", true, true}} {
		api := newFakeAPI()
		h := newConsole(t, api, c.base)
		r := httptest.NewRequest("POST", "/console/signin", strings.NewReader(url.Values{"api_key": {testKey}}.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.Header.Set("Origin", c.base)
		if c.tls {
			r.TLS = &tls.ConnectionState{}
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		cks := w.Result().Cookies()
		if w.Code != http.StatusSeeOther || len(cks) != 1 {
			t.Fatalf("%s: sign-in %d, cookies %v: %s", c.base, w.Code, cks, w.Body.String())
		}
		ck := cks[0]
		if ck.Name != "bc_session" || ck.Value != testSession || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/" || ck.Secure != c.secure {
			t.Fatalf("%s (tls %v): cookie %+v", c.base, c.tls, ck)
		}
	}
	api := newFakeAPI()
	h := newConsole(t, api, testOrigin)
	w := do(h, "POST", "/console/signout", testOrigin, url.Values{console.CSRFField: {console.CSRFToken(testSession)}}, true)
	if w.Code != http.StatusSeeOther || !api.revoked || !strings.Contains(w.Header().Get("Set-Cookie"), "Max-Age=0") {
		t.Fatalf("sign-out: %d, revoked %v, cookie %q", w.Code, api.revoked, w.Header().Get("Set-Cookie"))
	}
}

// A signed-out request for any page is redirected to the sign-in page
// without calling the API; a session the API no longer accepts is
// cleared and redirected too.
func TestConsoleSignedOutRedirects(t *testing.T) {
	api := newFakeAPI()
	h := newConsole(t, api, testOrigin)
	for _, path := range []string{"/console/", "/console/fleet", "/console/commands/c_1", "/console/batches", "/console/batches/b_1",
		"/console/approvals", "/console/audit", "/console/audit/proof/ev_1", "/console/sandboxes"} {
		w := do(h, "GET", path, "", nil, false)
		if path == "/console/" {
			w = do(h, "GET", w.Header().Get("Location"), "", nil, false)
		}
		if w.Code != http.StatusSeeOther || w.Header().Get("Location") != "/console/signin" {
			t.Fatalf("%s signed out: %d to %q", path, w.Code, w.Header().Get("Location"))
		}
	}
	for _, path := range []string{"/console/approvals/ap_1/approve", "/console/signout"} {
		w := do(h, "POST", path, testOrigin, url.Values{}, false)
		if w.Code != http.StatusSeeOther || w.Header().Get("Location") != "/console/signin" {
			t.Fatalf("POST %s signed out: %d to %q", path, w.Code, w.Header().Get("Location"))
		}
	}
	if len(api.calls) != 0 {
		t.Fatalf("signed-out requests called the API %d times", len(api.calls))
	}
	api.revoked = true
	w := do(h, "GET", "/console/fleet", "", nil, true)
	if w.Code != http.StatusSeeOther || w.Header().Get("Location") != "/console/signin" || !strings.Contains(w.Header().Get("Set-Cookie"), "Max-Age=0") {
		t.Fatalf("revoked session: %d to %q, cookie %q", w.Code, w.Header().Get("Location"), w.Header().Get("Set-Cookie"))
	}
}

// Every page reads through the API's envelope with the session: a POST
// /api/v1/<method> carrying the session cookie, the deployment's Origin,
// X-Better-Compute: 1, JSON, and the caller's own address.
func TestConsoleCallsTheAPIWithTheSession(t *testing.T) {
	api := newFakeAPI()
	h := newConsole(t, api, testOrigin)
	for _, path := range []string{"/console/fleet", "/console/commands/c_1", "/console/approvals"} {
		if w := do(h, "GET", path, "", nil, true); w.Code != 200 {
			t.Fatalf("%s: %d", path, w.Code)
		}
	}
	if len(api.calls) < 5 {
		t.Fatalf("only %d API calls", len(api.calls))
	}
	for _, r := range api.calls {
		ck, err := r.Cookie("bc_session")
		if err != nil || ck.Value != testSession || r.Header.Get("Origin") != testOrigin || r.Header.Get("X-Better-Compute") != "1" ||
			r.Header.Get("Content-Type") != "application/json" || r.RemoteAddr != "192.0.2.7:4242" || r.Header.Get("Authorization") != "" {
			t.Fatalf("call %s: cookie %v, headers %v, from %s", r.URL.Path, ck, r.Header, r.RemoteAddr)
		}
	}
}

// A refusal of the API renders as an error page with its code and
// status: whatever the API answers for a command it will not show (the
// fake answers NOT_FOUND, as the API does for root) is what the page says.
func TestConsoleRendersRefusals(t *testing.T) {
	h := newConsole(t, newFakeAPI(), testOrigin)
	w := do(h, "GET", "/console/commands/c_other", "", nil, true)
	if w.Code != http.StatusNotFound || !strings.Contains(w.Body.String(), "NOT_FOUND") || !strings.Contains(w.Body.String(), "Not found") {
		t.Fatalf("missing command: %d\n%s", w.Code, w.Body.String())
	}
}

// Without approvals methods in the API the approvals page shows none.
func TestConsoleApprovalsUnknownMethod(t *testing.T) {
	api := newFakeAPI()
	delete(api.methods, "approvals.list")
	h := newConsole(t, api, testOrigin)
	w := do(h, "GET", "/console/approvals", "", nil, true)
	if w.Code != 200 || !strings.Contains(w.Body.String(), "No approvals") {
		t.Fatalf("approvals without the method: %d\n%s", w.Code, w.Body.String())
	}
}

// Without the API's session cookie the console signs no one in: every
// page says what to configure, and sign-in never reaches the API.
func TestConsoleDisabledWithoutSessionCookies(t *testing.T) {
	api := newFakeAPI()
	c, err := console.New(console.Config{API: api, BaseURL: testOrigin})
	if err != nil {
		t.Fatal(err)
	}
	w := do(c, "POST", "/console/signin", testOrigin, url.Values{"api_key": {testKey}}, false)
	if w.Code != http.StatusServiceUnavailable || len(api.calls) != 0 || !strings.Contains(w.Body.String(), "session_cookies") {
		t.Fatalf("disabled console: %d, %d calls\n%s", w.Code, len(api.calls), w.Body.String())
	}
}

// Mount sends /console and /console/... to the console and all else on.
func TestMount(t *testing.T) {
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	h, err := console.Mount(next, console.Config{API: newFakeAPI(), SessionCookies: true, BaseURL: testOrigin})
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]int{"/console": 303, "/console/signin": 200, "/consolex": 418, "/api/v1/nodes.list": 418, "/": 418} {
		if w := do(h, "GET", path, "", nil, false); w.Code != want {
			t.Errorf("%s: %d, want %d", path, w.Code, want)
		}
	}
}

// A batch page shows its root, who proposed it (an agent's as "proposed
// by agent X for Y") and the exact line an approver runs offline.
func TestConsoleBatchPage(t *testing.T) {
	h := newConsole(t, newFakeAPI(), testOrigin)
	body := do(h, "GET", "/console/batches/b_1", "", nil, true).Body.String()
	for _, want := range []string{`<code id="root">ab12</code>`, "proposed by agent bot-1 for alice",
		"better-compute batch approve b_1 --key APPROVER.key --deployment dep.example"} {
		if !strings.Contains(body, want) {
			t.Fatalf("batch page lacks %q:\n%s", want, body)
		}
	}
}
