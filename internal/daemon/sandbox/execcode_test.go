package sandbox

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
)

// TestRuncExecExitCodes runs programs in a real runc sandbox: a program's
// own exit code and stderr come back as they are (255 included); a
// program that is not there exits 127 and one that cannot be executed 126,
// each with one clear line on stderr and none of runc's log lines.
func TestRuncExecExitCodes(t *testing.T) {
	h, digest := testHost(t, runcRuntime(t), clock.Real{})
	c := createSpec(digest, time.Now().Add(10*time.Minute), 64)
	mustCreate(t, h, c)
	for _, setup := range []string{"printf '#!/nonexistent\\n' > /tmp/script", "printf 'garbage' > /tmp/garbage", "chmod +x /tmp/script /tmp/garbage"} {
		if r := execIn(t, h, c.SandboxID, 10*time.Second, "sh", "-c", setup); r.ExitCode != 0 {
			t.Fatalf("%s: %+v", setup, r)
		}
	}
	for _, tc := range []struct {
		argv   []string
		code   int
		stderr string
	}{
		{[]string{"sh", "-c", "echo own >&2; exit 3"}, 3, "own\n"},
		{[]string{"sh", "-c", "echo own >&2; exit 255"}, 255, "own\n"},
		{[]string{"sh", "-c", "echo 'exec /bin/x: permission denied' >&2; exit 1"}, 1, "exec /bin/x: permission denied\n"},
		{[]string{"no-such-program", "arg"}, 127, "\"no-such-program\": command not found in the sandbox\n"},
		{[]string{"/no/such/file"}, 127, "\"/no/such/file\": no such file or directory in the sandbox\n"},
		{[]string{"/tmp/script"}, 127, "\"/tmp/script\": its interpreter is not found in the sandbox\n"},
		{[]string{"/etc/passwd"}, 126, "\"/etc/passwd\": cannot be executed in the sandbox: permission denied\n"},
		{[]string{"/etc"}, 126, "\"/etc\": cannot be executed in the sandbox: permission denied\n"},
		{[]string{"/tmp/garbage"}, 126, "\"/tmp/garbage\": cannot be executed in the sandbox: exec format error\n"},
	} {
		r := execIn(t, h, c.SandboxID, 10*time.Second, tc.argv...)
		if r.ExitCode != tc.code || string(r.Stderr) != tc.stderr {
			t.Errorf("%q: exit %d stderr %q, want %d %q", tc.argv, r.ExitCode, r.Stderr, tc.code, tc.stderr)
		}
		if bytes.Contains(r.Stderr, []byte("level=")) || strings.Count(string(r.Stderr), "\n") > 1 {
			t.Errorf("%q: runc's log reached stderr: %q", tc.argv, r.Stderr)
		}
	}
}

// startFailureCode is docker's mapping: not found 127, not executable
// 126, anything else is the runtime's failure.
func TestStartFailureCode(t *testing.T) {
	for msg, want := range map[string]int{
		`exec failed: unable to start container process: exec: "x": executable file not found in $PATH`:  127,
		`exec failed: unable to start container process: exec: "/x": stat /x: no such file or directory`: 127,
		`exec failed: unable to start container process: exec: "/etc": permission denied`:                126,
		`exec format error`:                     126,
		`exec failed: container does not exist`: 0,
	} {
		if code, _, _ := startFailureCode(msg); code != want {
			t.Errorf("%q: %d, want %d", msg, code, want)
		}
	}
}
