package api_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The Go client sends a call again after RATE_LIMITED, mutations without
// an Idempotency-Key included (client.Retry), which is safe only because
// RATE_LIMITED is refused before the method runs: in the envelope's
// authenticate stage (envelope.go) and its limit stage (tenantlimit.go).
// No other production code may answer it, so no handler can run a
// mutation and then refuse it RATE_LIMITED. The MCP gate's in-flight
// limit (internal/mcpgate/gate.go) refuses a tool call before it calls
// the API at all.
func TestRateLimitedOnlyBeforeTheMethod(t *testing.T) {
	allowed := map[string]bool{"internal/errs/errs.go": true, "internal/api/envelope.go": true, "internal/api/tenantlimit.go": true,
		"internal/mcpgate/gate.go": true}
	root := filepath.Join("..", "..")
	var found []string
	for _, dir := range []string{"internal", "client"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") || strings.Contains(p, "testdata") {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, p)
			rel = filepath.ToSlash(rel)
			if (strings.Contains(string(b), "errs.RateLimited") || strings.Contains(string(b), `"RATE_LIMITED"`)) && !allowed[rel] {
				found = append(found, rel)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(found) != 1 || found[0] != "client/client.go" {
		t.Fatalf("RATE_LIMITED is named outside the envelope's stages before the method: %v (want only client/client.go, the client's error value)", found)
	}
}
