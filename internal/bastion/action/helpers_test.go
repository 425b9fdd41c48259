package action

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
)

// requireRuntime skips the test, loudly, unless the OCI runtime name is
// installed, the test runs as root and a static busybox is there; with
// BC_REQUIRE_RUNC=1 it fails instead.
func requireRuntime(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	why := ""
	switch {
	case err != nil:
		why = name + " is not installed"
	case os.Geteuid() != 0:
		why = name + " containers need root"
	}
	if why == "" {
		if _, err := findBusybox(""); err != nil {
			why = err.Error()
		}
	}
	if why != "" {
		if os.Getenv("BC_REQUIRE_RUNC") == "1" {
			t.Fatalf("%s required (BC_REQUIRE_RUNC=1): %s", name, why)
		}
		t.Skipf("%s TEST NOT RUN: %s (set BC_REQUIRE_RUNC=1 to make this fatal)", strings.ToUpper(name), why)
	}
	return p
}

// requireRunc is requireRuntime for runc.
func requireRunc(t *testing.T) string { return requireRuntime(t, "runc") }

// fakeResolver answers from a table that a test may change.
type fakeResolver struct {
	mu      sync.Mutex
	answers map[string][]netip.Addr
	asked   map[string]int
}

func newFakeResolver() *fakeResolver {
	return &fakeResolver{answers: map[string][]netip.Addr{}, asked: map[string]int{}}
}

// set makes name resolve to addrs.
func (f *fakeResolver) set(name string, addrs ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answers[name] = nil
	for _, a := range addrs {
		f.answers[name] = append(f.answers[name], netip.MustParseAddr(a))
	}
}

// LookupNetIP implements netguard.Resolver.
func (f *fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked[host]++
	a, ok := f.answers[host]
	if !ok {
		return nil, errors.New("no such host")
	}
	return a, nil
}

// fakeLocal says the addresses in it are this machine's, nothing else.
type fakeLocal map[netip.Addr]bool

// IsLocal implements netguard.LocalChecker.
func (f fakeLocal) IsLocal(_ context.Context, a netip.Addr) (bool, string, error) {
	return f[a.Unmap()], "fake", nil
}

// testEnv is a Runner over temporary folders with a fake resolver, a
// fake this-machine check, a fake clock and a recorded dial.
type testEnv struct {
	r        *Runner
	folder   string
	state    string
	res      *fakeResolver
	clk      *clock.Fake
	anchored bool
	dialled  []string
	mu       sync.Mutex
}

// testOpts changes the Config newEnv builds.
type testOpts struct {
	runtime  string
	timeout  time.Duration
	local    fakeLocal
	anchored bool
	// dialTo sends every checked dial to this address instead (a test
	// server standing in for a public one).
	dialTo string
}

func newEnv(t *testing.T, o testOpts) *testEnv {
	t.Helper()
	e := &testEnv{folder: t.TempDir(), state: t.TempDir(), res: newFakeResolver(),
		clk: clock.NewFake(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)), anchored: o.anchored}
	if o.local == nil {
		o.local = fakeLocal{}
	}
	dial := func(ctx context.Context, network, address string) (net.Conn, error) {
		e.mu.Lock()
		e.dialled = append(e.dialled, address)
		e.mu.Unlock()
		if o.dialTo == "" {
			return nil, errors.New("test: no dial")
		}
		var d net.Dialer
		return d.DialContext(ctx, network, o.dialTo)
	}
	r, err := newRunner(Config{StateDir: e.state, Runtime: o.runtime, Resolver: e.res, Local: o.local, Clock: e.clk,
		Timeout: o.timeout, Anchored: func() bool { return e.anchored }}, dial)
	if err != nil {
		t.Fatal(err)
	}
	e.r = r
	return e
}

// write puts a file in the folder.
func (e *testEnv) write(t *testing.T, p, body string) {
	t.Helper()
	full := filepath.Join(e.folder, filepath.FromSlash(p))
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(full, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// read returns a folder file's content, or "<absent>".
func (e *testEnv) read(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(e.folder, filepath.FromSlash(p)))
	if errors.Is(err, os.ErrNotExist) {
		return "<absent>"
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// wantReason fails unless err is a refusal with exactly reason.
func wantReason(t *testing.T, err error, reason string) {
	t.Helper()
	var re interface{ RefusalReason() string }
	if !errors.As(err, &re) {
		t.Fatalf("want refusal %q, got %v", reason, err)
	}
	if re.RefusalReason() != reason {
		t.Fatalf("want refusal %q, got %q (%v)", reason, re.RefusalReason(), err)
	}
}

// execOutput runs a command and returns its standard output.
func execOutput(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).Output()
	return string(out), err
}
