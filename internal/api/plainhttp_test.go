package api_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/api"
)

// A plain-HTTP API listener off loopback answers only its trusted proxies:
// any other peer gets 403 ACCESS_DENIED before the request reaches the
// envelope, so an API key it sent in clear is never used.
func TestPlainHTTPAnswersOnlyTrustedProxies(t *testing.T) {
	proxies, err := api.ParseProxies([]string{"10.0.0.0/8"})
	if err != nil {
		t.Fatal(err)
	}
	reached := false
	h := api.OnlyFromProxies(proxies, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached = true }))
	for peer, want := range map[string]int{"10.1.2.3:5000": http.StatusOK, "192.0.2.7:5000": http.StatusForbidden, "127.0.0.1:5000": http.StatusForbidden, "garbage": http.StatusForbidden} {
		reached = false
		r := httptest.NewRequest(http.MethodPost, "/api/v1/nodes.list", strings.NewReader("{}"))
		r.RemoteAddr = peer
		r.Header.Set("Authorization", "Bearer bck_secret")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != want || reached != (want == http.StatusOK) {
			t.Fatalf("peer %s: %d reached=%v, want %d", peer, w.Code, reached, want)
		}
		if want == http.StatusForbidden && !strings.Contains(w.Body.String(), `"ACCESS_DENIED"`) {
			t.Fatalf("peer %s: %s", peer, w.Body.String())
		}
	}
}
