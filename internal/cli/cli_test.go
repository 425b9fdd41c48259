package cli

import (
	"bytes"
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
	if code := Main([]string{"secrets", "put", "--name", "x", "hunter2"}, &out, &errb); code == 0 {
		t.Fatal("a positional value accepted")
	}
}
