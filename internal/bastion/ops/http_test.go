package ops

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/netguard"
)

// post sends one op body and decodes the answer.
func post(t *testing.T, url, body string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Post(url+"/v1/op", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatalf("answer: %v", err)
	}
	return resp.StatusCode, m
}

func TestHandlerOps(t *testing.T) {
	f := newFixture(t, netguard.Config{})
	srv := httptest.NewServer(f.s.Handler())
	defer srv.Close()
	read := func(path string) string {
		return body(KindFilesRead, `{"share":"`+f.share+`","path":"`+path+`"}`)
	}
	status, m := post(t, srv.URL, read("a.txt"))
	res, _ := m["result"].(map[string]any)
	if status != 200 || m["ok"] != true || m["kind"] != KindFilesRead || res["data_base64"] != "aGVsbG8=" {
		t.Fatalf("files:read = %d %v", status, m)
	}
	status, m = post(t, srv.URL, read("missing"))
	if status != 404 || m["ok"] != false || m["code"] != CodeNotFound || m["reason"] != "not-found" {
		t.Fatalf("missing file = %d %v", status, m)
	}
	status, m = post(t, srv.URL, body(KindDryRun, `{"share":"`+f.share+`","script":"s","effects":["o"]}`))
	if status != 403 || m["reason"] != ReasonFactorNotEnrolled || m["message"] != EnrollHint {
		t.Fatalf("no factor = %d %v", status, m)
	}
	f.appr.enrolled.Store(true)
	status, m = post(t, srv.URL, body(KindDryRun, `{"share":"`+f.share+`","script":"s","effects":["o"]}`))
	exp, _ := time.Parse(time.RFC3339, m["approval_expires"].(string))
	if status != 409 || m["code"] != CodeApprovalRequired || !validID("apr_", 20, m["approval_request"].(string)) ||
		!exp.Equal(f.clk.Now().Add(5*time.Minute)) || !strings.HasPrefix(m["summary"].(string), KindDryRun) {
		t.Fatalf("approval required = %d %v", status, m)
	}
	n := len(f.audit.all())
	for _, b := range []string{`{`, body("observe:k8s", `{}`), read("a\\u0000")} {
		if status, m := post(t, srv.URL, b); status != 400 || m["code"] != CodeInvalidInput {
			t.Fatalf("malformed %q = %d %v", b, status, m)
		}
	}
	if status, _ := post(t, srv.URL, body(KindObserveDisk, `{}`)+strings.Repeat(" ", MaxBody)); status != 400 {
		t.Fatalf("too large = %d", status)
	}
	if got := len(f.audit.all()); got != n {
		t.Fatalf("malformed ops wrote %d audit entries", got-n)
	}
}

// A failure that is not a refusal is 500 INTERNAL_ERROR, with nothing of
// its detail in the answer.
func TestHandlerInternal(t *testing.T) {
	f := newFixture(t, netguard.Config{})
	f.appr.enrolled.Store(true)
	f.appr.standing[KindDryRun] = 1
	f.actions.fail = errors.New("runc: /secret/path exploded")
	srv := httptest.NewServer(f.s.Handler())
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/v1/op", "application/json",
		strings.NewReader(body(KindDryRun, `{"share":"`+f.share+`","script":"s","effects":["o"]}`)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 500 || strings.TrimSpace(string(raw)) != `{"ok":false,"code":"INTERNAL_ERROR","reason":"internal"}` {
		t.Fatalf("internal = %d %s", resp.StatusCode, raw)
	}
	resp2, err := http.Get(srv.URL + "/v1/other")
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	if resp2.StatusCode != 404 {
		t.Fatalf("other path = %d", resp2.StatusCode)
	}
}

// terminalRequest sends a raw GET /v1/terminal and returns the connection
// and the status line.
func terminalRequest(t *testing.T, addr, query string, upgrade bool) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	req := "GET /v1/terminal?" + query + " HTTP/1.1\r\nHost: bastion\r\n"
	if upgrade {
		req += "Connection: Upgrade\r\nUpgrade: bc-term-v1\r\n"
	}
	if _, err := io.WriteString(conn, req+"\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	return conn, br, resp
}

func TestHandlerTerminal(t *testing.T) {
	f := newFixture(t, netguard.Config{})
	f.appr.enrolled.Store(true)
	srv := httptest.NewServer(f.s.Handler())
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	session := testID("ts_", 20, 3)
	for _, q := range []string{"session=" + session + "&root=2", "session=ts_x&root=0", "session=" + session,
		"session=" + session + "&root=0&root=1", "session=" + session + "&root=0&x=1", "session=" + session + "&root=0&approval=apr_x"} {
		if _, _, resp := terminalRequest(t, addr, q, true); resp.StatusCode != 400 {
			t.Fatalf("query %q = %d", q, resp.StatusCode)
		}
	}
	if _, _, resp := terminalRequest(t, addr, "session="+session+"&root=0", false); resp.StatusCode != 400 {
		t.Fatalf("no upgrade headers = %d", resp.StatusCode)
	}
	if n := len(f.audit.all()); n != 0 {
		t.Fatalf("malformed terminal requests wrote %d audit entries", n)
	}
	_, _, resp := terminalRequest(t, addr, "session="+session+"&root=0", true)
	var m map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil || resp.StatusCode != 409 {
		t.Fatalf("terminal without approval = %d %v %v", resp.StatusCode, m, err)
	}
	id := m["approval_request"].(string)
	f.appr.approve(t, id)
	other := testID("ts_", 20, 4)
	if _, _, resp := terminalRequest(t, addr, "session="+other+"&root=0&approval="+id, true); resp.StatusCode != 403 {
		t.Fatalf("approval of another session = %d", resp.StatusCode)
	}
	conn, br, resp := terminalRequest(t, addr, "session="+session+"&root=0&approval="+id, true)
	if resp.StatusCode != 101 || resp.Header.Get("Upgrade") != TermProtocol {
		t.Fatalf("approved terminal = %d %v", resp.StatusCode, resp.Header)
	}
	if _, err := io.WriteString(conn, "echo me\n"); err != nil {
		t.Fatal(err)
	}
	line, err := br.ReadString('\n')
	if err != nil || line != "echo me\n" {
		t.Fatalf("echo = %q, %v", line, err)
	}
	if e := f.audit.last(t); e.kind != AuditOp || !strings.Contains(e.detail, "kind=terminal op="+session) {
		t.Fatalf("audit = %+v", e)
	}
	_, _, resp = terminalRequest(t, addr, "session="+session+"&root=0&approval="+id, true)
	if resp.StatusCode != 403 {
		t.Fatalf("approval reused = %d", resp.StatusCode)
	}
}
