package cli

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// The CLI never takes a secret value as an argument: put refuses to run
// without --value-file or --stdin, and has no flag that takes the value.
func TestSecretsPutTakesNoValueArgument(t *testing.T) {
	t.Setenv("BC_ADDR", "http://127.0.0.1:1")
	t.Setenv("BC_API_KEY", "bck_x")
	var out, errb bytes.Buffer
	if code := Main([]string{"secrets", "put", "--name", "x"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "--value-file or --stdin") {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	errb.Reset()
	if code := Main([]string{"secrets", "put", "--name", "x", "--value", "hunter2"}, &out, &errb); code == 0 {
		t.Fatal("--value accepted")
	}
	errb.Reset()
	if code := Main([]string{"secrets", "put", "--name", "x", "hunter2"}, &out, &errb); code != 2 {
		t.Fatalf("a positional value: exit %d, want 2", code)
	}
	if strings.Contains(out.String()+errb.String(), "hunter2") {
		t.Fatalf("the refusal echoes the value: %s%s", out.String(), errb.String())
	}
}

// serve refuses a bad configuration before starting anything, naming every
// problem with its field path.
func TestServeRefusesBadConfig(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/bc.toml"
	if err := os.WriteFile(path, []byte("roles = [\"api\", \"nope\"]\n[database]\ndsn = \"oracle:x\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := Main([]string{"serve", "--config", path}, &out, &errb)
	if code != 2 || !strings.Contains(errb.String(), "INVALID_CONFIG") || !strings.Contains(errb.String(), "roles[1]") || !strings.Contains(errb.String(), "database.dsn") {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	errb.Reset()
	if code := Main([]string{"serve", "--config", path, "--db", "sqlite:" + dir + "/x.db", "--roles", "api"}, &out, &errb); code != 2 || strings.Contains(errb.String(), "database.dsn") || strings.Contains(errb.String(), "roles") {
		t.Fatalf("flags did not override the file (exit %d): %s", code, errb.String())
	}
}

// commands fanout refuses a bad invocation before calling the API: no
// kind, both or neither of --node and --label, an empty node id, bad JSON.
func TestFanoutRefusesBadFlags(t *testing.T) {
	t.Setenv("BC_ADDR", "http://127.0.0.1:1")
	t.Setenv("BC_API_KEY", "bck_x")
	for _, args := range [][]string{
		{"--label", "a=b"},
		{"--kind", "diag.run"},
		{"--kind", "diag.run", "--node", "n1", "--label", "a=b"},
		{"--kind", "diag.run", "--node", ""},
		{"--kind", "diag.run", "--node", "n1", "--payload", "{"},
		{"--kind", "diag.run", "--node", "n1", "--ttl", "1500ms"},
	} {
		var out, errb bytes.Buffer
		if code := Main(append([]string{"commands", "fanout"}, args...), &out, &errb); code != 2 {
			t.Errorf("%v: exit %d (%s), want 2", args, code, errb.String())
		}
	}
}
