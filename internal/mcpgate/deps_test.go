package mcpgate

import (
	"os/exec"
	"strings"
	"testing"
)

// TestGateReadsNoDatabase: the gate is a client of the API and nothing
// else: it depends on no SQL driver, no store, no module that decides
// access (iam, apikeys) and not on the API's envelope package, so the
// only way its tools reach anything is an API call.
func TestGateReadsNoDatabase(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/bettercompute/bettercompute/internal/mcpgate").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list returned too little: %v", deps)
	}
	forbidden := []string{
		"database/sql",
		"modernc.org/sqlite",
		"github.com/jackc/pgx/v5",
		"github.com/bettercompute/bettercompute/internal/store",
		"github.com/bettercompute/bettercompute/internal/iam",
		"github.com/bettercompute/bettercompute/internal/apikeys",
		"github.com/bettercompute/bettercompute/internal/sandboxes",
		"github.com/bettercompute/bettercompute/internal/commands",
		"github.com/bettercompute/bettercompute/internal/nodes",
	}
	for _, d := range deps {
		if d == "github.com/bettercompute/bettercompute/internal/api" {
			t.Errorf("the gate depends on the API's envelope package %s", d)
		}
		for _, f := range forbidden {
			if d == f || strings.HasPrefix(d, f+"/") {
				t.Errorf("the gate depends on %s", d)
			}
		}
	}
}
