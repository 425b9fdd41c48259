package terminal

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
)

// defaultPath is the PATH of a terminal's shell and a root command.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// drainGrace bounds the wait for a finished process's last output and for
// the connection's reader once the session is over.
const drainGrace = 2 * time.Second

// Config configures Terminals.
type Config struct {
	// Dir is the bastion's data directory; transcripts go to
	// Dir/transcripts/ (0700), one 0600 file per session or command.
	Dir string
	// Shell is the terminal's shell, an absolute path. Default: $SHELL if
	// absolute and executable, else /bin/sh.
	Shell string
	// Clock times the grant watcher and the transcripts. Default: the
	// wall clock.
	Clock clock.Clock
	// Log gets operational lines (never input or output). Default: none.
	Log *slog.Logger
	// Audit is the bastion's audit chain: kind is one of the Kind
	// constants, reason an Event constant or a Reason constant.
	Audit func(kind, reason, detail string)
	// IsRoot reports whether the bastion runs as root. Default:
	// os.Geteuid() == 0.
	IsRoot func() bool
}

// Terminals runs terminals and root commands; it is safe for concurrent
// use.
type Terminals struct {
	dir    string // Dir/transcripts
	shell  string
	clock  clock.Clock
	log    *slog.Logger
	audit  func(kind, reason, detail string)
	isRoot func() bool
	home   string // HOME and working directory of what runs
	user   string // USER
}

// New checks cfg, fills its defaults and makes Dir/transcripts (0700; an
// existing one is set to 0700, a symlink there is refused).
func New(cfg Config) (*Terminals, error) {
	if cfg.Dir == "" {
		return nil, errors.New("terminal: no data directory")
	}
	shell := cfg.Shell
	if shell == "" {
		shell = defaultShell(os.Getenv("SHELL"))
	} else if !filepath.IsAbs(shell) {
		return nil, fmt.Errorf("terminal: shell %q is not an absolute path", shell)
	}
	dir := filepath.Join(cfg.Dir, "transcripts")
	if err := privateDir(dir); err != nil {
		return nil, err
	}
	t := &Terminals{dir: dir, shell: shell, clock: cfg.Clock, log: cfg.Log, audit: cfg.Audit, isRoot: cfg.IsRoot}
	if t.clock == nil {
		t.clock = clock.Real{}
	}
	if t.log == nil {
		t.log = slog.New(slog.DiscardHandler)
	}
	if t.audit == nil {
		t.audit = func(string, string, string) {}
	}
	if t.isRoot == nil {
		t.isRoot = func() bool { return os.Geteuid() == 0 }
	}
	t.user, t.home = whoami()
	return t, nil
}

// defaultShell is env if it is an absolute path to an executable regular
// file, else /bin/sh.
func defaultShell(env string) string {
	if filepath.IsAbs(env) {
		if fi, err := os.Stat(env); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return env
		}
	}
	return "/bin/sh"
}

// privateDir makes dir 0700, or sets an existing directory to 0700; a
// symlink or a file there is refused.
func privateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("terminal: transcripts directory: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("terminal: transcripts directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("terminal: transcripts directory %s is not a directory", dir)
	}
	if fi.Mode().Perm() != 0o700 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("terminal: transcripts directory: %w", err)
		}
	}
	return nil
}

// whoami returns this process's user name and home directory: from the
// user database, else the uid and $HOME (if absolute), else "/".
func whoami() (name, home string) {
	if u, err := user.Current(); err == nil && u.Username != "" && filepath.IsAbs(u.HomeDir) {
		name, home = u.Username, u.HomeDir
	} else {
		name, home = strconv.Itoa(os.Getuid()), os.Getenv("HOME")
	}
	if fi, err := os.Stat(home); !filepath.IsAbs(home) || err != nil || !fi.IsDir() {
		home = "/"
	}
	return name, home
}

// env is the minimal environment of a shell or command.
func (t *Terminals) env(extra ...string) []string {
	return append([]string{"HOME=" + t.home, "USER=" + t.user, "PATH=" + defaultPath}, extra...)
}

// transcript is one open transcript file; its writes are serialised and
// the first failure sticks.
type transcript struct {
	mu   sync.Mutex
	f    *os.File
	name string // base name, for the audit
	err  error
}

// openTranscript creates a new 0600 transcript named prefix, the time and
// a random suffix (and tag, a checked session id, when set).
func (t *Terminals) openTranscript(prefix, tag string) (*transcript, error) {
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, fmt.Errorf("terminal: transcript name: %w", err)
	}
	name := prefix + "-" + t.clock.Now().UTC().Format("20060102T150405Z")
	if tag != "" {
		name += "-" + tag
	}
	name += "-" + hex.EncodeToString(rnd[:]) + ".log"
	f, err := os.OpenFile(filepath.Join(t.dir, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("terminal: transcript: %w", err)
	}
	return &transcript{f: f, name: name}, nil
}

// write appends p; after a failure it returns that failure and writes
// nothing more.
func (tr *transcript) write(p []byte) error {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.err != nil {
		return tr.err
	}
	if _, err := tr.f.Write(p); err != nil {
		tr.err = fmt.Errorf("terminal: transcript %s: %w", tr.name, err)
	}
	return tr.err
}

// line appends a marked line: "\n[" + stamp + "] " + text + "\n".
func (tr *transcript) line(now time.Time, text string) error {
	return tr.write([]byte("\n[" + now.UTC().Format(time.RFC3339Nano) + "] " + text + "\n"))
}

// close syncs and closes the file, returning the first failure.
func (tr *transcript) close() error {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	err := tr.err
	if serr := tr.f.Sync(); err == nil && serr != nil {
		err = fmt.Errorf("terminal: transcript %s: %w", tr.name, serr)
	}
	if cerr := tr.f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("terminal: transcript %s: %w", tr.name, cerr)
	}
	if tr.err == nil {
		tr.err = errors.New("terminal: transcript closed")
	}
	return err
}
