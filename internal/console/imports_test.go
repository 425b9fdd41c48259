package console_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The console has one way to data, the API's envelope: it imports no
// store, no database driver and no module (nodes, commands, iam,
// apikeys, sandboxes, quorum, nor the api packages: it is a client of
// the API). Of this module it imports only the error codes and the audit
// log's offline proof checking.
func TestConsoleImportsNoModules(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, "github.com/bettercompute/bettercompute/internal/console").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	imports := strings.Fields(string(out))
	if len(imports) < 5 {
		t.Fatalf("go list returned too little: %v", imports)
	}
	allowed := []string{
		"github.com/bettercompute/bettercompute/internal/errs",
		"github.com/bettercompute/bettercompute/internal/auditlog",
	}
	for _, p := range imports {
		if p == "database/sql" || (strings.HasPrefix(p, "github.com/bettercompute/") && !slices.Contains(allowed, p)) {
			t.Errorf("the console imports %s", p)
		}
	}
}
