package sandbox

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/sandboxes/imagetar"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// fakeRT is a runtime that records which sandboxes it runs and what it
// was asked, under any name: the routing tests give a host two of them.
type fakeRT struct {
	name string
	mu   sync.Mutex
	inst map[string]bool // id -> alive
	ops  []string
}

func newFake(name string) *fakeRT { return &fakeRT{name: name, inst: map[string]bool{}} }

func (f *fakeRT) Name() string { return f.name }

func (f *fakeRT) log(op, id string) {
	f.ops = append(f.ops, op+" "+id)
}

func (f *fakeRT) Start(_ context.Context, c spec.Create, _ Placement) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log("start", c.SandboxID)
	f.inst[c.SandboxID] = true
	return nil
}

// Exec answers the runtime's name, so a test sees where it ran.
func (f *fakeRT) Exec(_ context.Context, id string, _, _ []string, _ bool) (spec.ExecResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log("exec", id)
	return spec.ExecResult{Stdout: []byte(f.name)}, nil
}

func (f *fakeRT) Remove(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log("remove", id)
	delete(f.inst, id)
	return nil
}

func (f *fakeRT) Running(_ context.Context, id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.inst[id]
	return ok
}

func (f *fakeRT) Alive(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.inst[id]
}

func (f *fakeRT) Instances(context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for id := range f.inst {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids, nil
}

// opsOf returns what f was asked about sandbox id.
func (f *fakeRT) opsOf(id string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, o := range f.ops {
		if strings.HasSuffix(o, " "+id) {
			out = append(out, strings.TrimSuffix(o, " "+id))
		}
	}
	return out
}

func (f *fakeRT) kill(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inst[id] = false
}

// TestHostRoutesEachSandboxToItsRuntime: a host with two runtimes
// advertises both, creates each sandbox on the runtime its spec names,
// and sends its exec, liveness and delete there and nowhere else; a spec
// naming a runtime the host lacks is refused runtime-unavailable.
func TestHostRoutesEachSandboxToItsRuntime(t *testing.T) {
	a, b := newFake(spec.RuntimeRunc), newFake(spec.RuntimeRunsc)
	h, digest := testHostRuntimes(t, func(string) []Runtime { return []Runtime{a, b} }, clock.Real{}, nil)
	l := h.Labels()
	if l[spec.RuntimeLabel(spec.RuntimeRunc)] != "true" || l[spec.RuntimeLabel(spec.RuntimeRunsc)] != "true" || l[spec.RuntimeLabel(spec.RuntimeSim)] != "" {
		t.Fatalf("labels %v, want runc and runsc only", l)
	}
	if got := h.Runtime(); got != "runc,runsc" {
		t.Fatalf("Runtime() = %q", got)
	}
	deadline := time.Now().Add(time.Hour)
	onA, onB := createSpec(digest, deadline, 64), createSpec(digest, deadline, 64)
	onB.Runtime = spec.RuntimeRunsc
	mustCreate(t, h, onA)
	mustCreate(t, h, onB)
	for _, c := range []struct {
		id   string
		want string
	}{{onA.SandboxID, spec.RuntimeRunc}, {onB.SandboxID, spec.RuntimeRunsc}} {
		if r := execIn(t, h, c.id, time.Second, "true"); string(r.Stdout) != c.want {
			t.Fatalf("exec in %s ran on %q, want %s", c.id, r.Stdout, c.want)
		}
	}
	if len(b.opsOf(onA.SandboxID)) != 0 || len(a.opsOf(onB.SandboxID)) != 0 {
		t.Fatalf("a runtime was asked about another's sandbox: runc %v, runsc %v", a.ops, b.ops)
	}
	// The sweep asks each sandbox's own runtime whether it lives.
	if h.Sweep(context.Background()); len(h.Sandboxes()) != 2 {
		t.Fatalf("a live sandbox was swept: %v left", h.Sandboxes())
	}
	var failed []string
	h.OnFailed(func(id, reason string) { failed = append(failed, id+" "+reason) })
	b.kill(onB.SandboxID)
	h.Sweep(context.Background())
	if !slices.Equal(failed, []string{onB.SandboxID + " " + ReasonRuntimeDied}) || !slices.Equal(h.Sandboxes(), []string{onA.SandboxID}) {
		t.Fatalf("after runsc's sandbox died: failed %v, held %v", failed, h.Sandboxes())
	}
	raw, _ := json.Marshal(spec.Delete{SandboxID: onA.SandboxID})
	if _, err := h.Delete(context.Background(), raw); err != nil {
		t.Fatal(err)
	}
	if got := a.opsOf(onA.SandboxID); !slices.Equal(got, []string{"start", "exec", "remove"}) {
		t.Fatalf("runc was asked %v about its sandbox", got)
	}
	if got := b.opsOf(onB.SandboxID); !slices.Equal(got, []string{"start", "exec", "remove"}) {
		t.Fatalf("runsc was asked %v about its sandbox", got)
	}
	absent := createSpec(digest, deadline, 64)
	absent.Runtime = spec.RuntimeSim
	raw, _ = json.Marshal(absent)
	if _, err := h.Create(context.Background(), raw); err == nil || err.Error() != "runtime-unavailable" {
		t.Fatalf("a spec on a runtime the host lacks: %v, want runtime-unavailable", err)
	}
}

// TestHostEgressRuncOnlyWithRunsc: a host with egress wiring, runc and
// runsc advertises egress, but refuses an egress sandbox on runsc
// (network-unavailable) before anything is reserved.
func TestHostEgressRuncOnlyWithRunsc(t *testing.T) {
	a, b := newFake(spec.RuntimeRunc), newFake(spec.RuntimeRunsc)
	h, digest := testHostRuntimes(t, func(string) []Runtime { return []Runtime{a, b} }, clock.Real{}, &Egress{})
	if h.Labels()[spec.EgressLabel] != "true" {
		t.Fatalf("labels %v lack egress", h.Labels())
	}
	c := createSpec(digest, time.Now().Add(time.Hour), 64)
	c.Runtime, c.Network = spec.RuntimeRunsc, spec.NetworkEgress
	raw, _ := json.Marshal(c)
	if _, err := h.Create(context.Background(), raw); err == nil || err.Error() != "network-unavailable" {
		t.Fatalf("egress on runsc: %v, want network-unavailable", err)
	}
	if len(h.Sandboxes()) != 0 || len(b.ops) != 0 {
		t.Fatalf("the refused sandbox left %v, runsc asked %v", h.Sandboxes(), b.ops)
	}
}

// TestHostAdoptsPerRuntime: a host that opens again asks each runtime
// about its own sandboxes: one its runtime still runs is adopted, one
// whose runtime lost it is removed (lost-at-restart) even though the
// other runtime knows nothing of it either, one whose runtime the host no
// longer runs is removed (lost-at-restart) without asking any runtime to
// remove it, and an instance a runtime runs with no state is killed on
// that runtime (unknown-to-host) and no other.
func TestHostAdoptsPerRuntime(t *testing.T) {
	a, b := newFake(spec.RuntimeRunc), newFake(spec.RuntimeRunsc)
	h, digest := testHostRuntimes(t, func(string) []Runtime { return []Runtime{a, b} }, clock.Real{}, nil)
	deadline := time.Now().Add(time.Hour)
	kept, lost, gone := createSpec(digest, deadline, 64), createSpec(digest, deadline, 64), createSpec(digest, deadline, 64)
	kept.Runtime, lost.Runtime = spec.RuntimeRunsc, spec.RuntimeRunsc
	for _, c := range []spec.Create{kept, lost, gone} {
		mustCreate(t, h, c)
	}
	unknown := createSpec(digest, deadline, 64)
	a.inst[unknown.SandboxID] = true // runc runs it; the host has no state
	delete(b.inst, lost.SandboxID)
	// The host reopens with runsc only: gone (on runc) has no runtime.
	cfg := h.cfg
	cfg.Runtime, cfg.Runtimes = nil, []Runtime{b}
	h2, err := OpenHost(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := h2.Sandboxes(); !slices.Equal(got, []string{kept.SandboxID}) {
		t.Fatalf("adopted %v, want only %s", got, kept.SandboxID)
	}
	if !a.inst[gone.SandboxID] || slices.Contains(a.opsOf(gone.SandboxID), "remove") {
		t.Fatal("a runtime the host no longer runs was asked to remove")
	}
	if !a.inst[unknown.SandboxID] {
		t.Fatal("a runtime the host no longer runs was listed")
	}
	got := map[string]string{}
	h2.OnFailed(func(id, reason string) { got[id] = reason })
	if len(got) != 2 || got[lost.SandboxID] != ReasonLostAtRestart || got[gone.SandboxID] != ReasonLostAtRestart {
		t.Fatalf("reported %v", got)
	}
	// With both runtimes again, runc's unknown instance is killed there.
	cfg.Runtimes = []Runtime{a, b}
	h3, err := OpenHost(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if a.inst[unknown.SandboxID] || len(b.opsOf(unknown.SandboxID)) != 0 || !slices.Equal(h3.Sandboxes(), []string{kept.SandboxID}) {
		t.Fatalf("unknown on runc: runc %v, runsc %v, held %v", a.opsOf(unknown.SandboxID), b.opsOf(unknown.SandboxID), h3.Sandboxes())
	}
}

// TestRuntimeNames: the runtime option takes one name, auto, or a list
// of runc and runsc, each once; sim runs alone.
func TestRuntimeNames(t *testing.T) {
	ctx := context.Background()
	for in, want := range map[string][]string{"runc": {"runc"}, "runsc": {"runsc"}, "sim": {"sim"}, "runc,runsc": {"runc", "runsc"}, " runsc , runc": {"runsc", "runc"}} {
		got, err := runtimeNames(ctx, Options{Runtime: in})
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("%q: %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "gvisor", "runc,", "runc,runc", "sim,runc", "runsc,sim", "auto,runc", "none"} {
		if got, err := runtimeNames(ctx, Options{Runtime: in}); err == nil {
			t.Fatalf("%q accepted: %v", in, got)
		}
	}
	both := []string{"runsc", "runc"}
	if RuntimeDir("d", "runc", both) == RuntimeDir("d", "runsc", both) {
		t.Fatal("runc and runsc share a directory")
	}
	if RuntimeDir("d", "runc", []string{"runc"}) != RuntimeDir("d", "runc", both) || RuntimeDir("d", "runsc", []string{"runsc"}) != filepath.Join("d", "rt") {
		t.Fatal("a one-runtime host's directory moved")
	}
}

// TestOpenRefusesUnusableRuntimeInList: Open of "runc,runsc" where runsc
// is not installed fails naming runsc.
func TestOpenRefusesUnusableRuntimeInList(t *testing.T) {
	bin := RequireRunc(t)
	path := t.TempDir()
	if err := os.Symlink(bin, filepath.Join(path, "runc")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", path)
	_, _, err := Open(context.Background(), Options{DataDir: t.TempDir(), Runtime: "runc,runsc", ImageStore: "mem://", Egress: "off"})
	if err == nil || !strings.Contains(err.Error(), "runsc is not usable") {
		t.Fatalf("open with runsc missing: %v", err)
	}
}

// TestRuncAndRunscOnOneHost opens a real host with runc and runsc side by
// side (through Open, as bcd does): it advertises both; a sandbox on each
// runs on its own kernel (runc's the host's, runsc's gVisor's), in its
// own runtime's bundles; a host opened again on the same directory
// adopts both; and deleting removes each from its runtime.
func TestRuncAndRunscOnOneHost(t *testing.T) {
	RequireRunc(t)
	RequireRunsc(t)
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "bcsbx-") // short: overlay options hold paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	store, digest := busyboxStore(t, dir)
	o := Options{DataDir: dir, Runtime: "runc,runsc", ImageStore: store, Egress: "off", Slots: 4, MemoryMB: 1024}
	h, closeFn, err := Open(ctx, o)
	if err != nil {
		t.Fatalf("open runc,runsc: %v", err)
	}
	t.Cleanup(closeFn)
	t.Cleanup(func() {
		for _, id := range h.Sandboxes() {
			_ = h.remove(context.Background(), id)
		}
	})
	if l := h.Labels(); l[spec.RuntimeLabel(spec.RuntimeRunc)] != "true" || l[spec.RuntimeLabel(spec.RuntimeRunsc)] != "true" {
		t.Fatalf("labels %v lack a runtime", l)
	}
	runc, runsc := h.rts[spec.RuntimeRunc].(*OCI), h.rts[spec.RuntimeRunsc].(*OCI)
	if runc.dir == runsc.dir || runc.bundles == runsc.bundles {
		t.Fatalf("runc and runsc share %s / %s", runc.dir, runc.bundles)
	}
	deadline := time.Now().Add(10 * time.Minute)
	onRunc, onRunsc := createSpec(digest, deadline, 64), createSpec(digest, deadline, 1024)
	onRunsc.Runtime = spec.RuntimeRunsc
	mustCreate(t, h, onRunc)
	mustCreate(t, h, onRunsc)
	for _, c := range []struct {
		o, other *OCI
		id       string
	}{{runc, runsc, onRunc.SandboxID}, {runsc, runc, onRunsc.SandboxID}} {
		if _, err := os.Stat(c.o.bundle(c.id)); err != nil || c.other.Running(ctx, c.id) {
			t.Fatalf("%s: bundle %v, on %s too: %v", c.id, err, c.other.name, c.other.Running(ctx, c.id))
		}
	}
	assertKernels(t, h, onRunc.SandboxID, onRunsc.SandboxID)
	// bcd restarts: the host opens again and adopts both.
	h2, close2, err := Open(ctx, o)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	t.Cleanup(close2)
	if got := h2.Sandboxes(); len(got) != 2 {
		t.Fatalf("reopened host holds %v", got)
	}
	assertKernels(t, h2, onRunc.SandboxID, onRunsc.SandboxID)
	for _, id := range []string{onRunc.SandboxID, onRunsc.SandboxID} {
		raw, _ := json.Marshal(spec.Delete{SandboxID: id})
		if _, err := h2.Delete(ctx, raw); err != nil {
			t.Fatal(err)
		}
		assertGone(t, h2, id)
	}
}

// assertKernels checks that sandbox onRunc runs on the host's kernel and
// onRunsc on gVisor's.
func assertKernels(t *testing.T, h *Host, onRunc, onRunsc string) {
	t.Helper()
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	release := unix.ByteSliceToString(u.Release[:])
	if r := execIn(t, h, onRunc, 30*time.Second, "uname", "-r"); strings.TrimSpace(string(r.Stdout)) != release {
		t.Fatalf("runc's uname -r = %q, want the host's %q", r.Stdout, release)
	}
	if r := execIn(t, h, onRunsc, 30*time.Second, "uname", "-r"); strings.TrimSpace(string(r.Stdout)) == release {
		t.Fatalf("runsc's uname -r = %q, the host's", r.Stdout)
	}
	if r := execIn(t, h, onRunsc, 30*time.Second, "dmesg"); !strings.Contains(string(r.Stdout), "gVisor") {
		t.Fatalf("runsc's dmesg = %q, not gVisor's", r.Stdout)
	}
}

// busyboxStore makes a file:// image store under dir holding the busybox
// image and returns its URL and the image's digest.
func busyboxStore(t *testing.T, dir string) (string, string) {
	t.Helper()
	tarball, err := imagetar.Busybox()
	if err != nil {
		t.Skip(err)
	}
	digest := imagetar.Digest(tarball)
	url := "file://" + filepath.Join(dir, "objects")
	if err := os.MkdirAll(filepath.Join(dir, "objects"), 0o700); err != nil {
		t.Fatal(err)
	}
	im, err := OpenImages(context.Background(), url, filepath.Join(dir, "seed"))
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	if err := im.bucket.WriteAll(context.Background(), ImageKey(digest), tarball, nil); err != nil {
		t.Fatal(err)
	}
	return url, digest
}
