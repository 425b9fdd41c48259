package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/sandboxes/imagetar"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

type entry struct {
	name, link string
	typ        byte
	body       string
}

func tarOf(t *testing.T, es ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range es {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: 0o755, Size: int64(len(e.body))}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.body != "" {
			_, _ = tw.Write([]byte(e.body))
		}
	}
	_ = tw.Close()
	return buf.Bytes()
}

// TestUnpackRefusesUnsafe: absolute names, "..", devices, FIFOs, links
// that leave the root and hard links to anything but an earlier file are
// refused, and nothing is written outside the target.
func TestUnpackRefusesUnsafe(t *testing.T) {
	cases := map[string][]entry{
		"absolute":           {{name: "/etc/passwd", typ: tar.TypeReg, body: "x"}},
		"dotdot":             {{name: "a/../../escape", typ: tar.TypeReg, body: "x"}},
		"char-device":        {{name: "dev/null", typ: tar.TypeChar}},
		"block-device":       {{name: "dev/sda", typ: tar.TypeBlock}},
		"fifo":               {{name: "fifo", typ: tar.TypeFifo}},
		"symlink-escapes":    {{name: "a/link", link: "../../etc", typ: tar.TypeSymlink}},
		"write-through-link": {{name: "out", link: "/", typ: tar.TypeSymlink}, {name: "out/x", typ: tar.TypeReg, body: "x"}},
		"hardlink-outside":   {{name: "h", link: "../etc/passwd", typ: tar.TypeLink}},
		"hardlink-unknown":   {{name: "h", link: "nothing", typ: tar.TypeLink}},
	}
	for name, es := range cases {
		t.Run(name, func(t *testing.T) {
			parent := t.TempDir()
			dir := filepath.Join(parent, "root")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			err := Unpack(bytes.NewReader(tarOf(t, es...)), dir)
			if !errors.Is(err, ErrUnsafeImage) {
				t.Fatalf("got %v, want ErrUnsafeImage", err)
			}
			if ents, _ := os.ReadDir(parent); len(ents) != 1 {
				t.Fatalf("something was written beside the root: %v", ents)
			}
		})
	}
	// A well-formed image unpacks, set-user-ID bits dropped, and an
	// absolute symlink (rooted in the image) is kept.
	dir := t.TempDir()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	_ = tw.WriteHeader(&tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755})
	_ = tw.WriteHeader(&tar.Header{Name: "bin/su", Typeflag: tar.TypeReg, Mode: 0o4755, Size: 2})
	_, _ = tw.Write([]byte("hi"))
	_ = tw.WriteHeader(&tar.Header{Name: "bin/sh", Typeflag: tar.TypeSymlink, Linkname: "/bin/su"})
	_ = tw.Close()
	if err := Unpack(&buf, dir); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, "bin/su"))
	if err != nil || fi.Mode()&os.ModeSetuid != 0 {
		t.Fatalf("bin/su: %v %v", fi.Mode(), err)
	}
}

// TestImagesVerifyDigest: bytes that do not hash to the signed digest are
// refused before anything is unpacked or cached.
func TestImagesVerifyDigest(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	im, err := OpenImages(ctx, "mem://", filepath.Join(dir, "cache"))
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	good := tarOf(t, entry{name: "hello", typ: tar.TypeReg, body: "world"})
	digest := imagetar.Digest(good)
	bad := tarOf(t, entry{name: "hello", typ: tar.TypeReg, body: "evil!"})
	if err := im.bucket.WriteAll(ctx, ImageKey(digest), bad, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := im.Ensure(ctx, digest); !errors.Is(err, ErrDigestMismatch) {
		t.Fatalf("got %v, want ErrDigestMismatch", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "cache")); len(ents) != 0 {
		t.Fatalf("a refused image left %v in the cache", ents)
	}
	if err := im.bucket.WriteAll(ctx, ImageKey(digest), good, nil); err != nil {
		t.Fatal(err)
	}
	root, err := im.Ensure(ctx, digest)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "hello")); string(b) != "world" {
		t.Fatalf("unpacked %q", b)
	}
}

// TestConfigControls checks the OCI configuration every runc sandbox gets.
func TestConfigControls(t *testing.T) {
	c := spec.Create{SandboxID: ids.New("sbx"), ImageDigest: "sha256:" + string(bytes.Repeat([]byte("a"), 64)), Runtime: spec.RuntimeRunc,
		Limits: spec.Limits{CPUMillis: 250, MemoryMB: 64, Pids: 32, DiskMB: 8}, Network: spec.NetworkNone, DeadlineMS: 1}
	cfg := Config(c, "/x/bc-init", nil, "", IDRange{})
	p := cfg.Process
	if p.User.UID != NobodyID || p.User.GID != NobodyID || !p.NoNewPrivileges {
		t.Fatalf("process user %+v, no new privileges %v", p.User, p.NoNewPrivileges)
	}
	caps := p.Capabilities
	if len(caps.Bounding)+len(caps.Effective)+len(caps.Permitted)+len(caps.Inheritable)+len(caps.Ambient) != 0 {
		t.Fatalf("capabilities %+v", caps)
	}
	if cfg.Hostname != c.SandboxID || cfg.Root.Path != "rootfs" {
		t.Fatalf("hostname %q root %+v", cfg.Hostname, cfg.Root)
	}
	var ns []string
	for _, n := range cfg.Linux.Namespaces {
		if n.Path != "" {
			t.Fatalf("namespace %s joins %s", n.Type, n.Path)
		}
		ns = append(ns, string(n.Type))
	}
	for _, want := range []string{"pid", "mount", "ipc", "uts", "network"} {
		if !slices.Contains(ns, want) {
			t.Fatalf("no new %s namespace: %v", want, ns)
		}
	}
	r := cfg.Linux.Resources
	if *r.Memory.Limit != 64<<20 || *r.Pids.Limit != 32 || *r.CPU.Quota != 25000 || *r.CPU.Period != 100000 {
		t.Fatalf("resources %+v", r)
	}
	s := cfg.Linux.Seccomp
	if s == nil || s.DefaultAction != "SCMP_ACT_ERRNO" {
		t.Fatalf("seccomp %+v", s)
	}
	// Only the native ABI: a 32-bit or x32 call kills the process.
	if len(s.Architectures) != 1 || (runtime.GOARCH == "amd64" && s.Architectures[0] != "SCMP_ARCH_X86_64") {
		t.Fatalf("seccomp architectures %v, want the native one alone", s.Architectures)
	}
	for _, sc := range s.Syscalls {
		for _, n := range sc.Names {
			if sc.Action == "SCMP_ACT_ALLOW" && slices.Contains([]string{"mount", "unshare", "setns", "bpf", "ptrace", "keyctl", "perf_event_open", "userfaultfd", "kexec_load", "init_module", "socketcall", "ipc"}, n) {
				t.Fatalf("seccomp allows %s", n)
			}
		}
	}
	for _, want := range []string{"/proc/kcore", "/proc/keys", "/sys/firmware"} {
		if !slices.Contains(cfg.Linux.MaskedPaths, want) {
			t.Fatalf("%s not masked", want)
		}
	}
	if !slices.Contains(cfg.Linux.ReadonlyPaths, "/proc/sys") {
		t.Fatal("/proc/sys not read-only")
	}
	if cfg.Process.Args[0] != InitPath {
		t.Fatalf("PID 1 is %v", cfg.Process.Args)
	}
	c.Root = true
	if u := Config(c, "", []string{"/bin/sleep"}, "", IDRange{}).Process.User; u.UID != 0 {
		t.Fatalf("root template runs as %+v", u)
	}
}

// TestHostRefusals: the host refuses what it was not signed to do, each
// with its reason: unknown payload fields, another runtime, a passed
// deadline, no capacity, a missing sandbox, a claim of a claimed one.
func TestHostRefusals(t *testing.T) {
	clk := clock.NewFake(time.Now())
	h, digest := testHost(t, func(string) Runtime { return NewSim() }, clk)
	h.cfg.Slots = 1
	ctx := context.Background()
	mk := func(mod func(*spec.Create)) []byte {
		c := spec.Create{SandboxID: ids.New("sbx"), ImageDigest: digest, Runtime: spec.RuntimeSim, Limits: spec.Limits{CPUMillis: 100, MemoryMB: 64, Pids: 16, DiskMB: 8},
			Network: spec.NetworkNone, DeadlineMS: clk.Now().Add(time.Hour).UnixMilli()}
		mod(&c)
		b, _ := json.Marshal(c)
		return b
	}
	withExtra := append(bytes.TrimSuffix(mk(func(*spec.Create) {}), []byte("}")), []byte(`,"privileged":true}`)...)
	for name, tc := range map[string]struct {
		payload []byte
		want    string
	}{
		"unknown-field":  {withExtra, "payload-invalid"},
		"other-runtime":  {mk(func(c *spec.Create) { c.Runtime = spec.RuntimeRunc }), "runtime-unavailable"},
		"deadline":       {mk(func(c *spec.Create) { c.DeadlineMS = clk.Now().Add(-time.Second).UnixMilli() }), "deadline-passed"},
		"network-egress": {mk(func(c *spec.Create) { c.Network = spec.NetworkEgress }), "network-unavailable"},
		"network-other":  {mk(func(c *spec.Create) { c.Network = "host" }), "payload-invalid"},
		"warm-with-env":  {mk(func(c *spec.Create) { c.Warm, c.Env = true, map[string]string{"A": "b"} }), "payload-invalid"},
	} {
		if _, err := h.Create(ctx, tc.payload); err == nil || err.Error() != tc.want {
			t.Errorf("%s: got %v, want %s", name, err, tc.want)
		}
	}
	id := ""
	if _, err := h.Create(ctx, mk(func(c *spec.Create) { id = c.SandboxID })); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Create(ctx, mk(func(*spec.Create) {})); err == nil || err.Error() != "no-capacity" {
		t.Fatalf("over capacity: %v", err)
	}
	upd, _ := json.Marshal(spec.Update{SandboxID: id, DeadlineMS: clk.Now().Add(time.Hour).UnixMilli(), Claim: true})
	if _, err := h.Update(ctx, upd); err == nil || err.Error() != "not-warm" {
		t.Fatalf("claim of a cold sandbox: %v", err)
	}
	ex, _ := json.Marshal(spec.Exec{SandboxID: ids.New("sbx"), Argv: []string{"true"}, TimeoutMS: 1000})
	if _, err := h.Exec(ctx, ex); err == nil || err.Error() != "sandbox-not-found" {
		t.Fatalf("exec in a missing sandbox: %v", err)
	}
	st, err := os.Stat(h.statePath(id))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("state file mode %v %v", st.Mode(), err)
	}
}

// TestHostRefusesProgramsInWarmSandbox: a warm sandbox runs nothing for a
// tenant (exec, shell, checkpoint) until a signed update has claimed it
// (a claim answers before its update reaches the host).
func TestHostRefusesProgramsInWarmSandbox(t *testing.T) {
	clk := clock.NewFake(time.Now())
	h, digest := testHost(t, func(string) Runtime { return NewSim() }, clk)
	ctx := context.Background()
	c := spec.Create{SandboxID: ids.New("sbx"), ImageDigest: digest, Runtime: spec.RuntimeSim, Limits: spec.Limits{CPUMillis: 100, MemoryMB: 64, Pids: 16, DiskMB: 8},
		Network: spec.NetworkNone, DeadlineMS: clk.Now().Add(time.Hour).UnixMilli(), Warm: true}
	raw, _ := json.Marshal(c)
	if _, err := h.Create(ctx, raw); err != nil {
		t.Fatal(err)
	}
	ex, _ := json.Marshal(spec.Exec{SandboxID: c.SandboxID, Argv: []string{"true"}, TimeoutMS: 1000})
	if _, err := h.Exec(ctx, ex); err == nil || err.Error() != ReasonNotClaimed {
		t.Fatalf("exec in a warm sandbox: %v, want %s", err, ReasonNotClaimed)
	}
	if _, err := h.OpenShell(ctx, c.SandboxID, []string{"sh"}); err == nil {
		t.Fatal("a shell opened in a warm sandbox")
	}
	ck, _ := json.Marshal(spec.Checkpoint{SandboxID: c.SandboxID})
	if _, err := h.Checkpoint(ctx, ck); err == nil || err.Error() != ReasonNotClaimed {
		t.Fatalf("checkpoint of a warm sandbox: %v, want %s", err, ReasonNotClaimed)
	}
	upd, _ := json.Marshal(spec.Update{SandboxID: c.SandboxID, DeadlineMS: clk.Now().Add(time.Hour).UnixMilli(), Claim: true})
	if _, err := h.Update(ctx, upd); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Exec(ctx, ex); err != nil {
		t.Fatalf("exec after the claim: %v", err)
	}
}

// TestHostReloadsStateAndSweeps: the deadline survives a restart of bcd
// (it is kept in the host's own state), and the sweep after reopening
// removes a sandbox whose deadline passed while bcd was down.
func TestHostReloadsStateAndSweeps(t *testing.T) {
	clk := clock.NewFake(time.Now())
	rt := NewSim()
	h, digest := testHost(t, func(string) Runtime { return rt }, clk)
	c := spec.Create{SandboxID: ids.New("sbx"), ImageDigest: digest, Runtime: spec.RuntimeSim, Limits: spec.Limits{CPUMillis: 100, MemoryMB: 64, Pids: 16, DiskMB: 8},
		Network: spec.NetworkNone, DeadlineMS: clk.Now().Add(time.Hour).UnixMilli()}
	raw, _ := json.Marshal(c)
	if _, err := h.Create(context.Background(), raw); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Hour)
	h2, err := OpenHost(context.Background(), HostConfig{Dir: h.cfg.Dir, Runtime: rt, Images: h.cfg.Images, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := h2.Get(c.SandboxID); ok || rt.Running(context.Background(), c.SandboxID) {
		t.Fatal("a sandbox past its deadline survived bcd's restart")
	}
}

// TestInitProgramIsELF sanity-checks the reaping init.
func TestInitProgramIsELF(t *testing.T) {
	p := initProgram()
	if p == nil {
		t.Skip("no init for this architecture")
	}
	if !bytes.HasPrefix(p, []byte("\x7fELF")) || len(p) != 64+56+64 {
		t.Fatalf("init is %d bytes", len(p))
	}
}

// TestCappedKeepsExactlyMaxOutput writes past spec.MaxOutput in uneven
// chunks: exactly the first 8 MiB are kept and truncation is flagged;
// exactly 8 MiB is kept whole and not flagged.
func TestCappedKeepsExactlyMaxOutput(t *testing.T) {
	if spec.MaxOutput != 8<<20 {
		t.Fatalf("MaxOutput = %d, want 8 MiB", spec.MaxOutput)
	}
	over := &capped{max: spec.MaxOutput}
	chunk := bytes.Repeat([]byte("0123456789abcdef"), 4099) // not a divisor of 8 MiB
	for written := 0; written <= spec.MaxOutput+len(chunk); written += len(chunk) {
		if n, err := over.Write(chunk); n != len(chunk) || err != nil {
			t.Fatalf("write: %d %v", n, err)
		}
	}
	if over.buf.Len() != spec.MaxOutput || !over.truncated {
		t.Fatalf("kept %d truncated %v, want %d true", over.buf.Len(), over.truncated, spec.MaxOutput)
	}
	exact := &capped{max: spec.MaxOutput}
	_, _ = exact.Write(make([]byte, spec.MaxOutput))
	if exact.buf.Len() != spec.MaxOutput || exact.truncated {
		t.Fatalf("exactly 8 MiB: kept %d truncated %v", exact.buf.Len(), exact.truncated)
	}
}

// TestIDRangeAllocation: a sandbox gets the first block of the reserved
// range no sandbox holds, so no two hold the same block; a range that
// reaches below 131072 or past the largest id, or blocks under 65536, is
// refused.
func TestIDRangeAllocation(t *testing.T) {
	used := map[uint32]bool{}
	var got []uint32
	for range 3 {
		r, err := allocIDRange(DefaultIDBase, DefaultIDSize, 3, used)
		if err != nil {
			t.Fatal(err)
		}
		if used[r.Base] || r.Size != DefaultIDSize {
			t.Fatalf("block %+v handed out twice", r)
		}
		used[r.Base] = true
		got = append(got, r.Base)
	}
	if _, err := allocIDRange(DefaultIDBase, DefaultIDSize, 3, used); err == nil {
		t.Fatal("a fourth block out of three")
	}
	delete(used, got[1])
	if r, _ := allocIDRange(DefaultIDBase, DefaultIDSize, 3, used); r.Base != got[1] {
		t.Fatalf("freed block %d not reused: %+v", got[1], r)
	}
	for _, bad := range []struct {
		base, size uint32
		n          int
	}{{65536, 65536, 1}, {DefaultIDBase, 4096, 1}, {1 << 31, 65536, 1 << 16}} {
		if checkIDRange(bad.base, bad.size, bad.n) == nil {
			t.Fatalf("range %+v accepted", bad)
		}
	}
	if err := checkIDRange(DefaultIDBase, DefaultIDSize, 16); err != nil {
		t.Fatal(err)
	}
}
