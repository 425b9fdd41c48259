package terminal

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// auditEvent is one call of Config.Audit.
type auditEvent struct{ kind, reason, detail string }

// auditLog records Config.Audit calls.
type auditLog struct {
	mu      sync.Mutex
	events  []auditEvent
	changed chan struct{}
}

func newAuditLog() *auditLog { return &auditLog{changed: make(chan struct{})} }

func (a *auditLog) add(kind, reason, detail string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.events = append(a.events, auditEvent{kind, reason, detail})
	close(a.changed)
	a.changed = make(chan struct{})
}

func (a *auditLog) all() []auditEvent {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]auditEvent(nil), a.events...)
}

// find returns the first event of kind and reason.
func (a *auditLog) find(kind, reason string) (auditEvent, bool) {
	for _, e := range a.all() {
		if e.kind == kind && e.reason == reason {
			return e, true
		}
	}
	return auditEvent{}, false
}

// waitFor waits (5 s at most) for an event of kind and reason.
func (a *auditLog) waitFor(t *testing.T, kind, reason string) auditEvent {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		a.mu.Lock()
		ch := a.changed
		a.mu.Unlock()
		if e, ok := a.find(kind, reason); ok {
			return e
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("no audit event %s/%s; got %v", kind, reason, a.all())
		}
	}
}

// newTerms returns Terminals on a temp dir with the audit recorded;
// mod changes the config first.
func newTerms(t *testing.T, mod func(*Config)) (*Terminals, *auditLog, string) {
	t.Helper()
	dir := t.TempDir()
	audit := newAuditLog()
	cfg := Config{Dir: dir, Shell: "/bin/sh", Audit: audit.add, IsRoot: func() bool { return true }}
	if mod != nil {
		mod(&cfg)
	}
	terms, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return terms, audit, dir
}

// transcripts returns the transcript files' paths.
func transcripts(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "transcripts", "*.log"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// onlyTranscript returns the one transcript's content, checking it is
// 0600 in a 0700 directory.
func onlyTranscript(t *testing.T, dir string) string {
	t.Helper()
	files := transcripts(t, dir)
	if len(files) != 1 {
		t.Fatalf("transcripts = %v, want one", files)
	}
	checkMode(t, filepath.Join(dir, "transcripts"), 0o700)
	checkMode(t, files[0], 0o600)
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func checkMode(t *testing.T, path string, want os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != want {
		t.Errorf("%s mode = %o, want %o", path, got, want)
	}
}

// wantRefusal checks err is a refusal with reason.
func wantRefusal(t *testing.T, err error, reason string) {
	t.Helper()
	var r interface{ RefusalReason() string }
	if !errors.As(err, &r) {
		t.Fatalf("err = %v, want refusal %s", err, reason)
	}
	if r.RefusalReason() != reason {
		t.Fatalf("reason = %q, want %q (%v)", r.RefusalReason(), reason, err)
	}
}

// alive reports whether pid is a live (not zombie) process.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || !strings.HasPrefix(strings.TrimSpace(string(b[i+1:])), "Z")
}

// waitGone polls /proc until pid is gone or a zombie, 5 s at most.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still alive", pid)
		}
		time.Sleep(10 * time.Millisecond) // polling /proc with a deadline, not synchronising
	}
}

// output collects what a client reads from conn.
type output struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{}
	done    chan struct{} // closed when the read ends
}

func readAll(r interface{ Read([]byte) (int, error) }) *output {
	o := &output{changed: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(o.done)
		b := make([]byte, 4096)
		for {
			n, err := r.Read(b)
			o.mu.Lock()
			o.buf.Write(b[:n])
			close(o.changed)
			o.changed = make(chan struct{})
			o.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return o
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// waitMatch waits (10 s at most) for re to match the output and returns
// its first group.
func (o *output) waitMatch(t *testing.T, re *regexp.Regexp) string {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		o.mu.Lock()
		m := re.FindStringSubmatch(o.buf.String())
		ch := o.changed
		o.mu.Unlock()
		if m != nil {
			return m[1]
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("output never matched %s: %q", re, o.String())
		}
	}
}
