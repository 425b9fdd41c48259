package cli

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
)

// --version prints the program, its version, the commit and the Go
// version on one line and exits 0.
func TestVersionFlag(t *testing.T) {
	var out, errb bytes.Buffer
	code := Main([]string{"--version"}, &out, &errb)
	if code != 0 || !strings.HasPrefix(out.String(), "better-compute ") || !strings.Contains(out.String(), ", commit ") ||
		!strings.HasSuffix(out.String(), runtime.Version()+"\n") {
		t.Fatalf("exit %d: %q %q", code, out.String(), errb.String())
	}
}
