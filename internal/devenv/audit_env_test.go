package devenv_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/cli"
	"github.com/bettercompute/bettercompute/internal/devenv"
)

// sourceEnv sets what a shell's `. DATA/env` would: each line is
// `export NAME='value'`, single-quoted as devenv writes it.
func sourceEnv(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		name, quoted, ok := strings.Cut(strings.TrimPrefix(line, "export "), "=")
		if !ok || !strings.HasPrefix(quoted, "'") || !strings.HasSuffix(quoted, "'") {
			t.Fatalf("env line %q", line)
		}
		v := strings.ReplaceAll(quoted[1:len(quoted)-1], `'\''`, `'`)
		vars[name] = v
		t.Setenv(name, v)
	}
	return vars
}

func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := cli.Main(args, &out, &errb)
	return code, out.String(), errb.String()
}

// `. DATA/env` is all the audit commands need: seal, verify and list work
// with no flag on dev's database, PKI bundle and key-encryption key, and
// without BC_DB list and prove go through the API as the dev admin.
func TestDevEnvRunsTheAuditCommands(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "dev")
	e, err := devenv.Start(context.Background(), devenv.Options{DataDir: dir, Nodes: 1, APIListen: "127.0.0.1:0", GatewayAddr: "127.0.0.1:0",
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Out: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	vars := sourceEnv(t, e.EnvFile)
	for name, want := range map[string]string{"BC_DB": "sqlite:" + filepath.Join(dir, "control.db"), "BC_PKI": filepath.Join(dir, "pki"), "BC_KEK_FILE": filepath.Join(dir, "kek")} {
		if vars[name] != want {
			t.Fatalf("%s = %q, want %q", name, vars[name], want)
		}
	}
	if code, out, errs := runCLI(t, "audit", "seal"); code != 0 || !strings.Contains(out, "sealed") {
		t.Fatalf("audit seal: %d %q %q", code, out, errs)
	}
	if code, out, errs := runCLI(t, "audit", "verify"); code != 0 || !strings.Contains(out, "ok: dev.bc.local/audit/root:") {
		t.Fatalf("audit verify: %d %q %q", code, out, errs)
	}
	code, out, errs := runCLI(t, "audit", "list", "--json")
	var listed struct {
		Events []map[string]any `json:"events"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &listed) != nil || len(listed.Events) == 0 || listed.Events[0]["sealed"] != true {
		t.Fatalf("audit list: %d %q %q", code, out, errs)
	}
	onDB := listed.Events

	t.Setenv("BC_DB", "") // no database: the API
	code, out, errs = runCLI(t, "audit", "list", "--json")
	listed.Events = nil
	if code != 0 || json.Unmarshal([]byte(out), &listed) != nil || len(listed.Events) < len(onDB) || listed.Events[0]["id"] != onDB[0]["id"] {
		t.Fatalf("audit list through the API: %d %q %q", code, out, errs)
	}
	event := onDB[0]["id"].(string)
	proof := filepath.Join(t.TempDir(), "proof")
	if code, out, errs := runCLI(t, "audit", "prove", "--event", event, "--out", proof); code != 0 {
		t.Fatalf("audit prove through the API: %d %q %q", code, out, errs)
	}
	code, vkey, _ := runCLI(t, "audit", "key")
	keyFile := filepath.Join(t.TempDir(), "vkey")
	if code != 0 || os.WriteFile(keyFile, []byte(vkey), 0o644) != nil {
		t.Fatalf("audit key: %d %q", code, vkey)
	}
	if code, out, errs := runCLI(t, "audit", "check-proof", proof, "--key", keyFile); code != 0 || !strings.Contains(out, `"id": "`+event+`"`) {
		t.Fatalf("check-proof: %d %q %q", code, out, errs)
	}
}
