package integration

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/sandboxes/previews"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
	"github.com/bettercompute/bettercompute/internal/store"
	"github.com/bettercompute/bettercompute/internal/store/storetest"
)

// previewOut is sandboxes.preview's answer.
type previewOut struct {
	URL       string `json:"url"`
	ExpiresAt string `json:"expires_at"`
	SandboxID string `json:"sandbox_id"`
	Port      int    `json:"port"`
}

// get fetches url and returns its status and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("read %s: %v", url, err)
	}
	return res.StatusCode, string(b)
}

// TestSandboxPreviewServesBusyboxHttpd: a preview URL of port 8080 in a
// runc sandbox serves the page busybox httpd serves there (reached inside
// the sandbox's own network namespace, through its node's session); a
// tampered token, a token of a rotated key and a deleted sandbox answer
// the same plain 404; another tenant cannot make a preview of the
// sandbox (NOT_FOUND, as for a missing one).
func TestSandboxPreviewServesBusyboxHttpd(t *testing.T) {
	storetest.ForEachDialect(t, func(t *testing.T, db *store.DB) {
		s := startSandboxes(t, db, nil, 0)
		ctx := context.Background()
		x, err := s.admin.CreateSandbox(ctx, "", "small")
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		const page = "<h1>hello from the sandbox</h1>"
		start := "mkdir -p /tmp/www && echo '" + page + "' > /tmp/www/index.html && (busybox httpd -f -p 127.0.0.1:8080 -h /tmp/www </dev/null >/dev/null 2>&1 &)"
		if r, err := s.admin.Exec(ctx, x.ID, []string{"sh", "-c", start}, 10); err != nil || r.ExitCode != 0 {
			t.Fatalf("start httpd: %+v %v", r, err)
		}
		if s.rt == spec.RuntimeRunc {
			waitServing(t, s.admin, x.ID)
		}
		var p previewOut
		if err := s.admin.Call(ctx, "sandboxes.preview", map[string]any{"id": x.ID, "port": 8080}, &p); err != nil {
			t.Fatalf("preview: %v", err)
		}
		if p.SandboxID != x.ID || p.Port != 8080 || !strings.Contains(p.URL, "/p/"+x.ID+"/8080/") {
			t.Fatalf("preview answered %+v", p)
		}
		code, body := get(t, p.URL)
		if s.rt != spec.RuntimeRunc {
			// The sim runtime has no network to reach: the node refuses
			// preview-unsupported and the proxy answers 502.
			if code != http.StatusBadGateway {
				t.Fatalf("sim preview: %d %q", code, body)
			}
			return
		}
		if code != http.StatusOK || !strings.Contains(body, page) {
			t.Fatalf("preview GET: %d %q", code, body)
		}
		// A tampered token: one character of its signature changed.
		tampered := tamper(p.URL)
		if code, body := get(t, tampered); code != http.StatusNotFound || body != previews.NotFoundBody {
			t.Fatalf("tampered preview: %d %q", code, body)
		}
		// Another tenant: refused exactly as for a missing sandbox (the
		// envelope resolves the sandbox's tenant first).
		_, other := s.TenantAdmin(t, "other")
		const missing = "sbxmissingmissingmi"
		errOther := other.Call(ctx, "sandboxes.preview", map[string]any{"id": x.ID, "port": 8080}, nil)
		errMissing := other.Call(ctx, "sandboxes.preview", map[string]any{"id": missing, "port": 8080}, nil)
		var eo, em *client.Error
		if !errors.As(errOther, &eo) || !errors.As(errMissing, &em) || eo.Code != "ACCESS_DENIED" || eo.Code != em.Code || eo.Status != em.Status ||
			withoutRequest(strings.ReplaceAll(eo.Message, x.ID, "ID")) != withoutRequest(strings.ReplaceAll(em.Message, missing, "ID")) {
			t.Fatalf("other tenant's preview: %v; missing sandbox: %v; want the same refusal", errOther, errMissing)
		}
		// Rotating the key kills the URL; one issued after works.
		if err := s.Client.Call(ctx, "previews.rotateKey", map[string]any{}, nil); err != nil {
			t.Fatalf("rotate: %v", err)
		}
		if code, body := get(t, p.URL); code != http.StatusNotFound || body != previews.NotFoundBody {
			t.Fatalf("old-key preview: %d %q", code, body)
		}
		var p2 previewOut
		if err := s.admin.Call(ctx, "sandboxes.preview", map[string]any{"id": x.ID, "port": 8080}, &p2); err != nil {
			t.Fatalf("preview after rotation: %v", err)
		}
		if code, body := get(t, p2.URL); code != http.StatusOK || !strings.Contains(body, page) {
			t.Fatalf("new-key preview GET: %d %q", code, body)
		}
		// A deleted sandbox: 404.
		if _, err := s.admin.DeleteSandbox(ctx, x.ID); err != nil {
			t.Fatalf("delete: %v", err)
		}
		if code, body := get(t, p2.URL); code != http.StatusNotFound || body != previews.NotFoundBody {
			t.Fatalf("deleted sandbox's preview: %d %q", code, body)
		}
	})
}

// waitServing waits until port 8080 answers inside sandbox id (asked
// from inside, by exec).
func waitServing(t *testing.T, c *client.Client, id string) {
	t.Helper()
	for range 100 {
		r, err := c.Exec(context.Background(), id, []string{"wget", "-q", "-O", "-", "http://127.0.0.1:8080/"}, 10)
		if err == nil && r.ExitCode == 0 {
			return
		}
	}
	t.Fatal("httpd never answered inside the sandbox")
}

// tamper changes one character of the token's signature in a preview URL.
func tamper(url string) string {
	i := strings.LastIndex(strings.TrimSuffix(url, "/"), ".") + 5
	c := byte('A')
	if url[i] == 'A' {
		c = 'B'
	}
	return url[:i] + string(c) + url[i+1:]
}

// withoutRequest drops an error message's "(request …)" suffix.
func withoutRequest(msg string) string {
	if i := strings.LastIndex(msg, " (request "); i >= 0 {
		return msg[:i]
	}
	return msg
}
