package terminal

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// MaxOutput is the most output of a root command Result carries; the
// transcript holds all of it.
const MaxOutput = 1 << 20

// MaxArgs is the longest argv RunRoot runs.
const MaxArgs = 64

// TruncatedNote ends a Result.Output that was cut at MaxOutput bytes.
const TruncatedNote = "\n[output truncated at 1048576 bytes; the transcript holds all of it]\n"

// WatchInterval is how often a running root command's grant is re-read.
const WatchInterval = 500 * time.Millisecond

// Why a root command was stopped (Result.Stopped).
const (
	// StoppedRevoked: the grant no longer held (it was revoked).
	StoppedRevoked = "grant-revoked"
	// StoppedExpired: the grant's end passed.
	StoppedExpired = "grant-expired"
)

// Grant is the root command grant, read on every check: until is its end
// and ok whether one is held at all.
type Grant func() (until time.Time, ok bool)

// Result is what a root command did.
type Result struct {
	ExitCode int    `json:"exit_code"` // -1 when it was killed
	Output   string `json:"output"`    // stdout and stderr combined, at most MaxOutput bytes (then TruncatedNote)
	Stopped  string `json:"stopped"`   // "", StoppedRevoked or StoppedExpired
}

// checkArgv returns why argv cannot run, or "".
func checkArgv(argv []string) string {
	switch {
	case len(argv) == 0:
		return "argv is empty"
	case len(argv) > MaxArgs:
		return "argv has more than " + strconv.Itoa(MaxArgs) + " entries"
	case !filepath.IsAbs(argv[0]):
		return "argv[0] is not an absolute path"
	}
	for _, a := range argv {
		if strings.IndexByte(a, 0) >= 0 {
			return "argv holds a NUL byte"
		}
	}
	return ""
}

// quoteArgv is argv as quoted words, for the audit and the transcript, cut
// at 4 KiB.
func quoteArgv(argv []string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = strconv.Quote(a)
	}
	s := strings.Join(q, " ")
	if len(s) > 4096 {
		s = s[:4096] + "..."
	}
	return s
}

// grantState returns why grant does not hold at now ("" when it does):
// StoppedRevoked when there is none, StoppedExpired when its end is past.
func grantState(grant Grant, now time.Time) (string, time.Time) {
	if grant == nil {
		return StoppedRevoked, time.Time{}
	}
	until, ok := grant()
	if !ok {
		return StoppedRevoked, until
	}
	if !now.Before(until) {
		return StoppedExpired, until
	}
	return "", until
}

// RunRoot runs argv as a root command. It refuses (audited, kind
// root-refuse) when the bastion is not root (ReasonNotRoot), when grant
// does not hold (ReasonNoRootGrant) and when argv is empty, too long, has
// a relative argv[0] or a NUL byte (ReasonBadArgv). Otherwise it runs argv
// itself, with no shell, in a process group of its own, with a minimal
// environment, stdin from /dev/null and stdout and stderr combined into
// the transcript and into Result.Output (cut at MaxOutput). While it runs,
// grant is re-read every WatchInterval and at its end; once it no longer
// holds, the process group is killed and Result.Stopped says why. Its
// start and end are audited (kind root-run: argv, pid, exit code; the
// output only in the transcript). When ctx ends, the command is killed and
// ctx's error returned with the Result.
func (t *Terminals) RunRoot(ctx context.Context, argv []string, grant Grant) (Result, error) {
	words := quoteArgv(argv)
	if !t.isRoot() {
		return Result{}, t.refuse(KindRootRefuse, ReasonNotRoot, "root commands need the bastion to run as root", "argv "+words)
	}
	if why, _ := grantState(grant, t.clock.Now()); why != "" {
		return Result{}, t.refuse(KindRootRefuse, ReasonNoRootGrant, "no root command grant holds ("+why+")", "argv "+words+" "+why)
	}
	if why := checkArgv(argv); why != "" {
		return Result{}, t.refuse(KindRootRefuse, ReasonBadArgv, why, "argv "+words+": "+why)
	}
	tr, err := t.openTranscript("root", "") // archtest:not-tenant (a file name prefix)
	if err != nil {
		t.audit(KindRootRefuse, EventSetupFailed, "argv "+words+": no transcript")
		return Result{}, err
	}
	defer tr.close()
	r := &rootRun{t: t, argv: argv, words: words, grant: grant, tr: tr}
	return r.run(ctx)
}

// rootRun is one root command.
type rootRun struct {
	t     *Terminals
	argv  []string
	words string // quoteArgv(argv)
	grant Grant
	tr    *transcript
	out   capture
}

// start writes the transcript's header and starts the command with its
// output on a pipe; it returns the pipe's read end.
func (r *rootRun) start() (*exec.Cmd, *os.File, error) {
	if err := r.tr.line(r.t.clock.Now(), "root command "+r.words); err != nil {
		return nil, nil, err
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("terminal: output pipe: %w", err)
	}
	cmd := exec.Command(r.argv[0], r.argv[1:]...)
	cmd.Env = r.t.env()
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = pw, pw
	cmd.SysProcAttr = rootCmdAttr()
	err = cmd.Start()
	pw.Close()
	if err != nil {
		pr.Close()
		return nil, nil, fmt.Errorf("terminal: start root command: %w", err)
	}
	return cmd, pr, nil
}
