package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/store/storetest"
	"github.com/bettercompute/bettercompute/internal/testenv"
)

// TestAPIKeyFileOpenToOthersRefused: the CLI refuses a BC_API_KEY_FILE
// that group or other may access (any of the six bits), exit 2, naming the
// file and the fix, before any call; at 0600 or 0400 it is used.
func TestAPIKeyFileOpenToOthersRefused(t *testing.T) {
	e := testenv.Start(t, storetest.NewTestSQLite(t), testenv.Options{})
	path := filepath.Join(t.TempDir(), "admin.key")
	if err := os.WriteFile(path, []byte(e.AdminKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("BC_ADDR", "http://"+e.CP.APIAddr)
	t.Setenv("BC_API_KEY", "")
	t.Setenv("BC_API_KEY_FILE", path)
	for _, bit := range []os.FileMode{0o040, 0o020, 0o010, 0o004, 0o002, 0o001} {
		if err := os.Chmod(path, 0o600|bit); err != nil {
			t.Fatal(err)
		}
		code, out, errOut := run(t, "nodes", "list")
		if code != 2 || out != "" || !strings.Contains(errOut, "BC_API_KEY_FILE "+path+" is accessible to group or other") || !strings.Contains(errOut, "chmod 600") {
			t.Errorf("mode %04o: exit %d: %s%s", 0o600|bit, code, out, errOut)
		}
		if strings.Contains(errOut, e.AdminKey) {
			t.Fatal("the refusal shows the key")
		}
	}
	for _, mode := range []os.FileMode{0o600, 0o400} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		if code, _, errOut := run(t, "nodes", "list"); code != 0 {
			t.Errorf("mode %04o: exit %d: %s", mode, code, errOut)
		}
	}
}
