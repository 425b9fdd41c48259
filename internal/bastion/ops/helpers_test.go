package ops

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/netguard"
)

var testB32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// testID returns prefix and n base32 characters made from seq.
func testID(prefix string, n int, seq uint64) string {
	var b [20]byte
	binary.BigEndian.PutUint64(b[12:], seq)
	return prefix + testB32.EncodeToString(b[:])[32-n:]
}

// fakeRefusal is another package's refusal, seen only through
// RefusalReason.
type fakeRefusal struct{ reason string }

func (e *fakeRefusal) Error() string         { return "fake: " + e.reason }
func (e *fakeRefusal) RefusalReason() string { return e.reason }

func refuse(reason string) error { return &fakeRefusal{reason} }

// fakeApprovals is a small in-memory approval store with the approval
// package's rules: a request is bound to its kind and digest, approved
// apart, spent once, dead after 5 minutes; 5 refused writes in 10 minutes
// lock writes for 10 minutes; a standing grant is a count of runs left.
type fakeApprovals struct {
	anchored atomic.Bool // the machine is anchored
	clk      clock.Clock
	enrolled atomic.Bool

	mu       sync.Mutex
	seq      uint64
	reqs     map[string]*fakeRequest
	standing map[string]int
	refused  []time.Time
}

type fakeRequest struct {
	kind, digest, summary string
	expires               time.Time
	approved, spent       bool
}

func newFakeApprovals(clk clock.Clock) *fakeApprovals {
	return &fakeApprovals{clk: clk, reqs: map[string]*fakeRequest{}, standing: map[string]int{}}
}

func (f *fakeApprovals) Enrolled() bool { return f.enrolled.Load() }
func (f *fakeApprovals) Anchored() bool { return f.anchored.Load() }

func (f *fakeApprovals) Ask(kind, digest, summary string) (string, time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	id := testID("apr_", 20, f.seq)
	exp := f.clk.Now().Add(5 * time.Minute)
	f.reqs[id] = &fakeRequest{kind: kind, digest: digest, summary: summary, expires: exp}
	return id, exp, nil
}

// approve is the person entering a code for id on the machine.
func (f *fakeApprovals) approve(t *testing.T, id string) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.reqs[id]
	if !ok {
		t.Fatalf("approve: no request %s", id)
	}
	r.approved = true
}

func (f *fakeApprovals) asked() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.seq
}

func (f *fakeApprovals) Spend(id, kind, digest string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.reqs[id]
	switch {
	case !ok:
		return refuse("unknown-request")
	case r.kind != kind || r.digest != digest:
		return refuse("approval-mismatch")
	case !r.approved:
		return refuse("not-approved")
	case !f.clk.Now().Before(r.expires):
		return refuse("approval-expired")
	case r.spent:
		return refuse("approval-spent")
	}
	r.spent = true
	return nil
}

func (f *fakeApprovals) UseStanding(kind string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.standing[kind] == 0 {
		return refuse("no-standing")
	}
	f.standing[kind]--
	return nil
}

func (f *fakeApprovals) NoteRefusedWrite() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refused = append(f.refused, f.clk.Now())
}

func (f *fakeApprovals) WritesLocked() (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.clk.Now()
	var recent []time.Time
	for _, at := range f.refused {
		if now.Sub(at) < 10*time.Minute {
			recent = append(recent, at)
		}
	}
	if len(recent) < 5 {
		return time.Time{}, false
	}
	until := recent[len(recent)-1].Add(10 * time.Minute)
	return until, now.Before(until)
}

// fakeFiles serves real folders through os.Root: one share id per folder.
type fakeFiles struct{ shares map[string]string }

func (f *fakeFiles) root(share string) (*os.Root, error) {
	dir, ok := f.shares[share]
	if !ok {
		return nil, refuse("unknown-share")
	}
	return os.OpenRoot(dir)
}

func notFound(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return refuse("not-found")
	}
	return err
}

func (f *fakeFiles) List(share, path string) (any, error) {
	r, err := f.root(share)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	if path == "" {
		path = "."
	}
	d, err := r.Open(path)
	if err != nil {
		return nil, notFound(err)
	}
	defer d.Close()
	return d.Readdirnames(-1)
}

func (f *fakeFiles) Stat(share, path string) (any, error) {
	r, err := f.root(share)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	fi, err := r.Lstat(path)
	if err != nil {
		return nil, notFound(err)
	}
	return map[string]any{"name": fi.Name(), "size": fi.Size()}, nil
}

func (f *fakeFiles) Read(share, path string) ([]byte, error) {
	r, err := f.root(share)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	b, err := r.ReadFile(path)
	return b, notFound(err)
}

func target(m Move) string {
	if m.To == "" {
		return "Archive/" + m.From
	}
	return m.To
}

func (f *fakeFiles) CheckMoves(share string, moves []Move) error {
	r, err := f.root(share)
	if err != nil {
		return err
	}
	defer r.Close()
	for _, m := range moves {
		if _, err := r.Lstat(m.From); err != nil {
			return notFound(err)
		}
		if _, err := r.Lstat(target(m)); err == nil {
			return refuse("destination-exists")
		}
	}
	return nil
}

func (f *fakeFiles) ApplyMoves(share string, moves []Move) (any, error) {
	if err := f.CheckMoves(share, moves); err != nil {
		return nil, err
	}
	r, err := f.root(share)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	for _, m := range moves {
		if err := r.MkdirAll(filepath.Dir(target(m)), 0o700); err != nil {
			return nil, err
		}
		if err := r.Rename(m.From, target(m)); err != nil {
			return nil, err
		}
	}
	return map[string]any{"moved": moves, "archive": "Archive"}, nil
}

// fakeActions keeps dry-run plans in memory and applies each once.
type fakeActions struct {
	shares map[string]string
	fail   error // returned by DryRun when set

	mu    sync.Mutex
	runs  int
	plans map[string]string // id -> digest
}

func (f *fakeActions) Check(share string, a DryRunArgs) error {
	if _, ok := f.shares[share]; !ok {
		return refuse("unknown-share")
	}
	return nil
}

func (f *fakeActions) DryRun(_ context.Context, a DryRunArgs) (any, error) {
	if f.fail != nil {
		return nil, f.fail
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.runs++
	id := testID("pl_", 20, uint64(f.runs))
	sum := sha256.Sum256([]byte(a.Script))
	f.plans[id] = hex.EncodeToString(sum[:])
	return map[string]any{"plan": id, "digest": f.plans[id]}, nil
}

func (f *fakeActions) ranDryRun() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.runs
}

func (f *fakeActions) PlanSummary(plan, digest string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, ok := f.plans[plan]
	switch {
	case !ok:
		return "", refuse("unknown-plan")
	case d != digest:
		return "", refuse("plan-mismatch")
	}
	return "creates 1 file", nil
}

func (f *fakeActions) Apply(_ context.Context, a ApplyArgs) (any, error) {
	if _, err := f.PlanSummary(a.Plan, a.Digest); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.plans, a.Plan)
	return []string{"out.txt"}, nil
}

// fakeRoot runs nothing; it answers what it was asked.
type fakeRoot struct{ runs atomic.Int32 }

func (f *fakeRoot) Run(_ context.Context, argv []string) (any, error) {
	f.runs.Add(1)
	return map[string]any{"exit_code": 0, "output": strings.Join(argv, " "), "stopped": ""}, nil
}

// echoTerminals echoes every byte back until the client closes.
type echoTerminals struct {
	mu       sync.Mutex
	sessions []string
}

func (e *echoTerminals) Serve(_ context.Context, conn io.ReadWriteCloser, session string, root bool) error {
	e.mu.Lock()
	e.sessions = append(e.sessions, session)
	e.mu.Unlock()
	_, err := io.Copy(conn, conn)
	return err
}

// auditLog records Audit calls.
type auditLog struct {
	mu      sync.Mutex
	entries []auditEntry
}

type auditEntry struct{ kind, reason, detail string }

func (a *auditLog) add(kind, reason, detail string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.entries = append(a.entries, auditEntry{kind, reason, detail})
}

func (a *auditLog) all() []auditEntry {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]auditEntry(nil), a.entries...)
}

// last returns the last entry, failing when there is none.
func (a *auditLog) last(t *testing.T) auditEntry {
	t.Helper()
	all := a.all()
	if len(all) == 0 {
		t.Fatal("no audit entry")
	}
	return all[len(all)-1]
}

// fixture is a Server over the fakes, one real shared folder and a real,
// unanchored netguard.Dialer.
type fixture struct {
	s       *Server
	clk     *clock.Fake
	appr    *fakeApprovals
	files   *fakeFiles
	actions *fakeActions
	root    *fakeRoot
	terms   *echoTerminals
	audit   *auditLog
	isRoot  atomic.Bool
	share   string // share id
	dir     string // its folder
}

var testShare = testID("sh_", 12, 7)

func newFixture(t *testing.T, guard netguard.Config) *fixture {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.txt"), []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := &fixture{clk: clock.NewFake(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)), share: testShare, dir: dir,
		root: &fakeRoot{}, terms: &echoTerminals{}, audit: &auditLog{}}
	shares := map[string]string{testShare: dir}
	f.appr = newFakeApprovals(f.clk)
	f.files = &fakeFiles{shares: shares}
	f.actions = &fakeActions{shares: shares, plans: map[string]string{}}
	d, err := netguard.NewDialer(guard)
	if err != nil {
		t.Fatal(err)
	}
	f.s, err = New(Config{Approvals: f.appr, Files: f.files, Actions: f.actions, Root: f.root, Terminals: f.terms,
		Audit: f.audit.add, Dialer: d, Shares: func() []string { return []string{dir} },
		IsRoot: f.isRoot.Load, Clock: f.clk})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// op builds a valid op of kind with args.
func (f *fixture) op(t *testing.T, kind string, args any, approval string) Op {
	t.Helper()
	op, err := newOp(testID("op_", 26, 1), kind, args, approval)
	if err != nil {
		t.Fatalf("newOp %s: %v", kind, err)
	}
	return op
}

// wantRefused checks err is a refusal with code and reason.
func wantRefused(t *testing.T, err error, code, reason string) *RefusedError {
	t.Helper()
	var re *RefusedError
	if !errors.As(err, &re) {
		t.Fatalf("err = %v, want a refusal %s", err, reason)
	}
	if re.Code != code || re.Reason != reason {
		t.Fatalf("refused %s %s (%s), want %s %s", re.Code, re.Reason, re.Detail, code, reason)
	}
	return re
}

func dryRun(share, script string) DryRunArgs {
	return DryRunArgs{Share: share, Script: script, Effects: []string{"out.txt"}, Inputs: []Input{}}
}
