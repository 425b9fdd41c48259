package sandbox

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"regexp"
	"strings"

	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// The exit codes of an exec whose program never ran, as docker exec and
// POSIX shells give them.
const (
	// ExitNotExecutable: the program exists but cannot be run (no execute
	// permission, a directory, not a format the kernel runs).
	ExitNotExecutable = 126
	// ExitNotFound: no such program (or its interpreter is missing).
	ExitNotFound = 127
)

// runcExecFailed is runc's own exit status when `runc exec` could not
// start the process (its fatalWithCode(…, 255)).
const runcExecFailed = 255

// runtimeLogError returns the message of the last error runc wrote to its
// --log file (JSON lines), or "" when it wrote none. Only runc writes the
// file (it sits in the bundle, out of the sandbox's reach), so a program in
// the sandbox cannot make its own exit look like runc's.
func runtimeLogError(logPath string) string {
	f, err := os.Open(logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	last := ""
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var e struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
		}
		if json.Unmarshal(sc.Bytes(), &e) == nil && (e.Level == "error" || e.Level == "fatal") && e.Msg != "" {
			last = e.Msg
		}
	}
	return last
}

// startFailureCode maps why a program could not be started (runc's message,
// or the errno text of a failed execve) to 127 or 126, as docker does: ok is
// false for any other failure (the runtime's own, not the program's).
func startFailureCode(msg string) (code int, why string, ok bool) {
	switch {
	case strings.HasPrefix(msg, "interpreter not found"):
		return ExitNotFound, "its interpreter is not found", true
	case strings.Contains(msg, "executable file not found"):
		return ExitNotFound, "command not found", true
	case strings.Contains(msg, "no such file or directory"):
		return ExitNotFound, "no such file or directory", true
	case strings.Contains(msg, "permission denied"):
		return ExitNotExecutable, "permission denied", true
	case strings.Contains(msg, "is a directory"):
		return ExitNotExecutable, "is a directory", true
	case strings.Contains(msg, "exec format error"):
		return ExitNotExecutable, "exec format error", true
	}
	return 0, "", false
}

// lateExecRE is what runc's init prints (and exits 1 with) when it found
// the program but execve failed: a missing interpreter, a file the kernel
// cannot run.
var lateExecRE = regexp.MustCompile(`^exec (/[^\n]*): ([a-z ]+)\n$`)

// notStarted rewrites res when the program of argv never ran: runc exited
// 255 having logged why to logPath, or runc's init printed the one line of
// a failed execve of argv[0] and exited 1. The exit code becomes 127 (not
// found) or 126 (not executable) and stderr one line saying so, never
// runc's log line. An error is a failure of the runtime itself.
func notStarted(res spec.ExecResult, argv []string, logPath string) (spec.ExecResult, error) {
	var msg string
	switch res.ExitCode {
	case runcExecFailed:
		msg = runtimeLogError(logPath)
	case 1:
		m := lateExecRE.FindSubmatch(res.Stderr)
		if m == nil || len(res.Stdout) != 0 || path.Base(string(m[1])) != path.Base(argv[0]) {
			return res, nil
		}
		msg = string(m[2])
		if strings.Contains(msg, "no such file or directory") {
			// The program was found: what is missing is its interpreter.
			msg = "interpreter not found: " + msg
		}
	}
	if msg == "" {
		return res, nil
	}
	code, why, ok := startFailureCode(msg)
	if !ok {
		return res, errors.New("sandbox: exec: the runtime could not start the process: " + msg)
	}
	out := spec.ExecResult{ExitCode: code}
	if code == ExitNotFound {
		out.Stderr = fmt.Appendf(nil, "%q: %s in the sandbox\n", argv[0], why)
	} else {
		out.Stderr = fmt.Appendf(nil, "%q: cannot be executed in the sandbox: %s\n", argv[0], why)
	}
	return out, nil
}
