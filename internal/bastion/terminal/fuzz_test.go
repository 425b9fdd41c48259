package terminal

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var sessionSpec = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// FuzzRequest: the session id and argv checks, which take the control
// plane's input, never panic, accept a session id exactly when it is safe
// in a file name, and accept an argv only with an absolute argv[0], no NUL
// and 1 to MaxArgs entries (argv is the input split at newlines).
func FuzzRequest(f *testing.F) {
	f.Fuzz(func(t *testing.T, session, argvText string) {
		if validSession(session) != sessionSpec.MatchString(session) {
			t.Fatalf("validSession(%q) = %v", session, validSession(session))
		}
		var argv []string
		if argvText != "" {
			argv = strings.Split(argvText, "\n")
		}
		why := checkArgv(argv)
		ok := len(argv) >= 1 && len(argv) <= MaxArgs && filepath.IsAbs(argv[0]) && !strings.Contains(argvText, "\x00")
		if (why == "") != ok {
			t.Fatalf("checkArgv(%q) = %q, want ok %v", argv, why, ok)
		}
		_ = quoteArgv(argv)
	})
}
