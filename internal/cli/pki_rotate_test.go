package cli_test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// TestPKIRotateCommands walks a key through the three steps as an operator
// would and checks the refusals: out of order (exit 1, FAILED_PRECONDITION
// and the step to take), an unknown key (exit 2), retire within 24h
// without --force; and that `audit key` prints the rotated audit keys.
func TestPKIRotateCommands(t *testing.T) {
	dir := t.TempDir()
	kekFile, pkiDir := filepath.Join(dir, "kek"), filepath.Join(dir, "pki")
	if code, _, errOut := run(t, "pki", "init", "--dir", pkiDir, "--kek-file", kekFile, "--trust-domain", "rot.bc.local"); code != 0 {
		t.Fatalf("pki init: %d %s", code, errOut)
	}
	step := func(want int, args ...string) (string, string) {
		t.Helper()
		args = append([]string{"pki", "rotate"}, args...)
		args = append(args, "--dir", pkiDir)
		if args[2] != "retire" {
			args = append(args, "--kek-file", kekFile)
		}
		code, out, errOut := run(t, args...)
		if code != want {
			t.Fatalf("%v: exit %d, want %d (%s%s)", args, code, want, out, errOut)
		}
		return out, errOut
	}
	if _, errOut := step(1, "activate", "audit-key"); !strings.Contains(errOut, "FAILED_PRECONDITION: pki rotate activate audit-key: no staged audit-key; stage one first: better-compute pki rotate stage audit-key") {
		t.Fatalf("activate before stage: %s", errOut)
	}
	if _, errOut := step(2, "stage", "tls-key"); !strings.Contains(errOut, `unknown key "tls-key"`) {
		t.Fatalf("unknown key: %s", errOut)
	}
	out, _ := step(0, "stage", "audit-key")
	if !strings.Contains(out, "audit-key: stage done") || !strings.Contains(out, "next: ") || !strings.Contains(out, "pki rotate activate audit-key") {
		t.Fatalf("stage output: %s", out)
	}
	out, _ = step(0, "activate", "audit-key", "--json")
	var res struct {
		Key, Step string
		Rotation  []struct{ Key, State string }
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Step != "activate" || len(res.Rotation) != 1 || res.Rotation[0].State != "previous" {
		t.Fatalf("activate --json: %v %s", err, out)
	}
	if _, errOut := step(1, "retire", "audit-key"); !strings.Contains(errOut, "replaced less than 24h ago") {
		t.Fatalf("retire too early: %s", errOut)
	}
	step(0, "retire", "audit-key", "--force")
	code, keys, _ := run(t, "audit", "key", "--pki", pkiDir)
	if lines := strings.Fields(keys); code != 0 || len(lines) != 2 || !strings.HasPrefix(lines[0], "rot.bc.local/audit+") {
		t.Fatalf("audit key after rotation: %d %q", code, keys)
	}
}
